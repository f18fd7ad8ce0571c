"""Shared fixture of the training tests: a run killed right after one of its steps is logged."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

import privlm.training.loop as loop


class _Killed(RuntimeError):
    """The simulated kill."""


@pytest.fixture
def killed_after_step() -> Callable[[int], contextlib.AbstractContextManager[None]]:
    """``with killed_after_step(k): train_loop(...)`` runs the loop until step ``k``'s metrics line is on disk and
    kills it there (the kill is expected: the block fails if the loop finishes); the patch ends with the block."""

    @contextlib.contextmanager
    def killed(at_step: int) -> Iterator[None]:
        write = loop.append_metrics

        def append_then_kill(run_dir, record):
            write(run_dir, record)
            if record.get("step") == at_step:
                raise _Killed(f"killed after the metrics line of step {at_step}")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(loop, "append_metrics", append_then_kill)
            with pytest.raises(_Killed):
                yield

    return killed
