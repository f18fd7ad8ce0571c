"""What ``privlm synth`` and ``privlm demo`` need of a synthesis method: :class:`SynthCommand`.

A method that ``privlm synth --method NAME`` can run carries a :class:`SynthCommand` in its registry
record (:class:`privlm.synthesis.registry.Method`): its own command-line options (:class:`SynthOption`,
each setting one field of its config), the entry point that checks a :class:`SynthRequest` and returns the
run, and the run folder it keeps beside its output. The command line builds ``privlm synth``'s options from
every registered method's and loops over the registry: adding a method edits no command-line file.

The entry point, ``prepare(request) -> run``, checks everything it can **before** a model is loaded or a
file written (bad input is a :class:`~privlm.errors.UserError`); ``run(model, tokenizer, progress)`` then
makes the set and returns a :class:`SynthOutcome`. All of this module is import-light: records are data,
entry points are ``"module:function"`` strings resolved when a method runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privlm.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from privlm.progress import Progress
    from privlm.resources.datasets import DataSpec
    from privlm.runfolder import RunFolder

SPLIT_SEED = 0  # the private set is the train split of the dataset's standard seeded split


@dataclass(frozen=True)
class SynthOption:
    """One method option of ``privlm synth``: ``flag`` as typer spells it (``--rho``, ``--contrastive/--no-contrastive``),
    the config ``field`` it sets, its value ``type`` (int, float, str or bool) and its ``help``. Not given: the
    method's default."""

    flag: str
    field: str
    type: type
    help: str = ""


@dataclass(frozen=True)
class SynthCommand:
    """How ``privlm synth`` runs a method: its ``options``, ``prepare`` (``"module:function"``,
    :func:`prepare` below), ``run_folder`` (``"module:Class"``, a :class:`~privlm.runfolder.RunFolder` taking the
    output path), the lines of ``privlm demo``'s plan (``plan``), and ``dp_only`` (refuses ``--no-dp``)."""

    options: tuple[SynthOption, ...]
    prepare: str
    run_folder: str
    plan: tuple[str, ...] = ()
    dp_only: bool = False

    def folder(self, out: Path) -> RunFolder:
        """The run folder beside ``out`` where the method keeps its release (ledger, ``run.json``) for reuse."""
        return _resolve(self.run_folder)(out)

    def start(
        self, request: SynthRequest
    ) -> Callable[[PreTrainedModel, PreTrainedTokenizerBase, Progress], SynthOutcome]:
        """Check ``request`` (before any model is loaded) and return the run."""
        unknown = set(request.options) - {o.field for o in self.options}
        if unknown:
            raise UserError(f"--method {request.method} takes no {', '.join(sorted(unknown))} option")
        if self.dp_only and not request.dp:
            raise UserError(
                f"--method {request.method} is differentially private only: give --epsilon and --delta, not --no-dp"
            )
        return _resolve(self.prepare)(request)


@dataclass(frozen=True)
class SynthRequest:
    """One ``privlm synth`` (or demo) run: the ``method``, model name, private ``data`` (its train split, or
    the first ``private_per_class`` of each class), the public ``labels`` of user data, ``per_class``
    synthetic examples, output ``out``, privacy (``dp``, ε, δ), ``resume``, and the method ``options`` given
    (config field → value)."""

    method: str
    model_name: str
    data: str | DataSpec
    labels: Any
    per_class: int
    out: Path
    dp: bool
    epsilon: float | None
    delta: float | None
    private_per_class: int | None = None
    resume: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    def check_output(self) -> None:
        """``per_class`` ≥ 1 and an existing output folder (every method's first check)."""
        if self.per_class < 1:
            raise UserError(f"--per-class must be >= 1 (got {self.per_class})")
        if not self.out.parent.is_dir():
            raise UserError(f"output folder {self.out.parent} does not exist")

    def private_loader(self, workdir: Path) -> Callable[[], list[tuple[str, int]]]:
        """The loader of the private examples for a run kept in ``workdir``: a run already there is refused
        unless ``resume``; the rows are read now (bad rows or a cut larger than a class refused before
        anything is written) unless a resume may reuse a saved release without them."""
        if workdir.exists() and not self.resume:
            raise UserError(
                f"{workdir} holds a run for {self.out}; pass --resume to continue or reuse it, or remove it"
            )
        load = private_examples(self.data, self.private_per_class, self.labels)
        return load().copy if self.private_per_class is not None or not self.resume else load

    def settings(self) -> dict[str, Any]:
        """The public settings a run binds to its folder (checked on resume)."""
        return {"model": self.model_name, "data": str(self.data), "private_per_class": self.private_per_class}


@dataclass(frozen=True)
class SynthOutcome:
    """A finished run: its ``rows``, the sidecar's ``privacy`` statement, ``extra`` facts for ``--json``, the
    ``detail`` of its mechanism (formatted with the privacy statement and its settings), ``notes`` (lines to
    print after the privacy line), the ``score`` column of the rows table (title, row → text) and the wall time."""

    method: str
    out: Path
    rows: list[dict[str, Any]]
    privacy: dict[str, Any]
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    notes: tuple[str, ...] = ()
    score: tuple[str, Callable[[dict[str, Any]], str]] = ("score", lambda row: "")

    def summary(self) -> dict[str, Any]:
        """The ``--json`` output."""
        return {
            "out": str(self.out),
            "method": self.method,
            "rows": self.rows,
            "privacy": self.privacy,
            **self.extra,
            "wall_s": self.wall_s,
        }


def private_examples(
    data: str | DataSpec, per_class: int | None, labels: object = None
) -> Callable[[], list[tuple[str, int]]]:
    """A loader of the private examples: the train split, the first ``per_class`` of each class.

    Unit of privacy: this list *is* the private dataset of the guarantee (add/remove one of its
    examples, sensitivity C). The selection is by position, so if a larger file is regarded as the
    private dataset, adding one record there can also push another out of the first ``per_class``
    (sensitivity up to 2C), which the stated ε does not cover: ε is for the set read. The train split
    of user data is per row (a row's split depends on its own text only), so it adds no such effect;
    the built-in data sets' stratified split does. A file given as ``--train`` is the whole private set.
    ``labels``: the public class names (``--labels``), never read off the rows."""

    def load() -> list[tuple[str, int]]:
        from privlm.resources.datasets import load_dataset

        taken: dict[int, int] = {}
        chosen = []
        for text, label in load_dataset(data, split="train", seed=SPLIT_SEED, labels=labels).examples:
            if per_class is None or taken.get(label, 0) < per_class:
                taken[label] = taken.get(label, 0) + 1
                chosen.append((text, label))
        if per_class is not None and min(taken.values(), default=0) < per_class:
            raise UserError(
                f"--private-per-class {per_class} is larger than a class of the private train split (class sizes "
                "are private and not shown); omit it to use the whole split"
            )
        return chosen

    return load


def public_label_names(request: SynthRequest) -> tuple[Sequence[str], Any]:
    """The data's public class names and verbalizer (nothing of the private rows is read)."""
    from privlm.resources.datasets import load_dataset

    dataset = load_dataset(request.data, split=None, seed=SPLIT_SEED, labels=request.labels)
    return dataset.label_names, dataset.verbalizer


def _resolve(entry: str) -> Any:
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)
