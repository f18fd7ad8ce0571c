"""Shared test configuration: deterministic, offline, one intra-op thread.

Tiny models run many small tensor ops; on a 2-core machine thread synchronisation dominates them
(measured 10-14x slower with 2 threads while the other core is busy), so every test runs on one
intra-op thread and restores the previous setting afterwards.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from privlm.progress import Progress, Task
from privlm.randomness import SecureRandom

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def research_script():
    """``research_script("synthetic_at_scale/report.py")``: the research script loaded as a module (registered in
    ``sys.modules`` while it executes, as dataclasses need), without running its ``main``."""

    def load(relative: str) -> types.ModuleType:
        path = Path(__file__).resolve().parents[1] / "research" / relative
        name = "research_" + relative.removesuffix(".py").replace("/", "_")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(autouse=True)
def single_thread():
    """Run the test on one torch intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def seeded_os_keys(monkeypatch):
    """The mechanisms' noise keys come from the OS; here the k-th key drawn is the seeded stream k, so that
    the tests are deterministic (and successive draws, e.g. PE's T histograms, stay independent)."""
    counter = itertools.count()
    monkeypatch.setattr(
        SecureRandom, "from_os", classmethod(lambda cls: SecureRandom.from_seed(next(counter), "audit-test"))
    )


@pytest.fixture
def head_votes():
    """``votes(model, prompt, rows, candidates)``: the class a copy of ``model`` whose LM head's label-token rows
    are ``rows`` (K × d) predicts for each candidate, one forward pass of ``prefix + ids + suffix`` each (the
    embeddings untied and unchanged): an independent reference for a head applied to cached hidden states."""

    def votes(model, prompt, rows, candidates) -> list[int]:
        copied = copy.deepcopy(model)
        labels = list(prompt.label_token_ids)
        weight = copied.get_output_embeddings().weight.detach().clone()
        weight[labels] = rows.to(weight.dtype)
        copied.get_output_embeddings().weight = torch.nn.Parameter(weight, requires_grad=False)
        assert copied.get_output_embeddings().weight is not copied.get_input_embeddings().weight
        out = []
        for c in candidates:
            ids = torch.tensor([[*prompt.prefix_ids, *c.ids, *prompt.suffix_ids]])
            out.append(int(copied(input_ids=ids).logits[0, -1, labels].argmax()))
        return out

    return votes


class _PoisonedPool(list):
    """A private pool that fails the test as soon as it is read (iterated, indexed or, unless ``size`` is given,
    measured)."""

    def __init__(self, size: int | None = None) -> None:
        super().__init__()
        self.size = size

    def __iter__(self):
        pytest.fail("the private pool was read")

    def __getitem__(self, index):
        pytest.fail("the private pool was read")

    def __len__(self) -> int:
        if self.size is None:
            pytest.fail("the private pool was read")
        return self.size


@pytest.fixture
def poisoned_pool() -> list:
    """A private pool that must not be read: a method that reads it fails the test."""
    return _PoisonedPool()


@pytest.fixture
def size_only_pool():
    """``size_only_pool(n)``: a private pool of which only the size (``n``) may be read."""
    return _PoisonedPool


class _RecordedProgress(Progress):
    """Records every call on the tasks it opens, in order (``events``: ``(description opened with, private, call,
    value)``; an opening's value is its total, an update's its (total, count)). Derived from them: the tasks
    opened, ``(description, total, private)`` in order; the units advanced per description (``advanced_by``;
    ``advanced``: in all); the tasks done (``finished``)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bool, str, Any]] = []

    @property
    def opened(self) -> list[tuple[str, float | None, bool]]:
        return [(d, total, private) for d, private, call, total in self.events if call == "open"]

    @property
    def advanced_by(self) -> dict[str, float]:
        counts: dict[str, float] = {}
        for d, _, call, amount in self.events:
            if call == "advance":
                counts[d] = counts.get(d, 0.0) + amount
        return counts

    @property
    def advanced(self) -> float:
        return sum(self.advanced_by.values())

    @property
    def finished(self) -> list[str]:
        return [d for d, _, call, _ in self.events if call == "done"]

    def public_view(self) -> tuple[list[tuple[str, str, Any]], dict[str, float]]:
        """What a reporter may show of the public tasks: their openings (with totals), updates (totals and counts)
        and ends in order, and the units advanced on each (summed: how a count is split into calls may depend on
        the texts written)."""
        public = {description for description, _, private in self.opened if not private}
        calls = [(d, call, value) for d, private, call, value in self.events if not private and call != "advance"]
        return calls, {d: n for d, n in self.advanced_by.items() if d in public}

    def task(
        self, description: str, total: float | None = None, private: bool = False, transient: bool = False
    ) -> Task:
        self.events.append((description, private, "open", total))
        recorder, opened_as = self, description

        class _Recorded(Task):
            def update(
                self, *, description: str | None = None, completed: float | None = None, total: float | None = None
            ) -> None:
                recorder.events.append((opened_as, private, "update", (total, completed)))

            def advance(self, amount: float = 1) -> None:
                recorder.events.append((opened_as, private, "advance", amount))

            def done(self) -> None:
                recorder.events.append((opened_as, private, "done", None))

        return _Recorded()


@pytest.fixture
def recorded_progress() -> _RecordedProgress:
    """A :class:`~privlm.progress.Progress` that records what a method shows (``opened``, ``advanced``)."""
    return _RecordedProgress()


class _KilledAtCall:
    """Calls ``real`` and counts the calls that went through (``calls``); call ``at`` (1-based; None: none)
    raises KeyboardInterrupt instead: a process killed while that call runs."""

    def __init__(self, real: Callable[..., Any], at: int | None = None) -> None:
        self.real, self.at, self.calls = real, at, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.calls + 1 == self.at:
            raise KeyboardInterrupt
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def killed_at_call() -> type[_KilledAtCall]:
    """``killed_at_call(real, at)``: a stand-in for ``real`` that is killed at its ``at``-th call and counts the
    calls before it (:class:`_KilledAtCall`)."""
    return _KilledAtCall
