"""The one registry of the ways privlm makes a training set of n examples per class.

Every method lives in its own subpackage of :mod:`privlm.synthesis` whose ``__init__`` registers it with
:func:`register_method` and imports nothing heavy: a :class:`Method` names its code as
``"module:function"``, imported when the method first runs. :func:`load_methods` imports every
subpackage (found on disk, so adding a method edits no shared list). ``privlm synth --method``, the
experiment's ``[methods.*]`` tables and the README's method table (:func:`methods_table`) all read this
registry.

A method maps a :class:`MethodContext` to rows (``text``, ``label``, extra fields kept in the cached
set). ``privacy`` says what the resulting set guarantees about the private pool; it is copied to every
results row.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privlm.errors import UserError
from privlm.progress import SILENT, Progress

if TYPE_CHECKING:
    import numpy as np
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from privlm.lm.scoring import Example
    from privlm.synthesis.command import SynthCommand

PUBLIC = "public: sees no private data"
NON_PRIVATE = "NON-PRIVATE: uses private examples directly"
SET_FILE = "synthetic.jsonl"


@dataclass
class MethodContext:
    """What a method may use. ``pool`` is the private pool; DP methods must touch it only through
    their own private mechanism. ``pool_features()`` gives the base model's last-token features of the
    pool (computed once per experiment). ``workdir`` is a folder reserved for this cell; ``private_cache``
    a folder shared by the experiment's cells for what is computed once from the pool (PRIVATE: as
    sensitive as the pool, never published). A DP method writes its set to :attr:`out` (its
    ``.privacy.json`` sidecar beside it) and keeps its run folders, with their write-ahead ledgers, under
    ``workdir`` or ``private_cache`` only: the experiment composes every draw it finds there
    (:mod:`privlm.experiments.grid_privacy`). ``progress``: where long stages show their bars (public counts
    only: a count of private rows goes on a task opened with ``private=True``)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    pool: Sequence[Example]
    label_names: Sequence[str]
    template: str
    label_words: Sequence[str]
    n_per_class: int
    seed: int
    epsilon: float | None
    delta: float
    workdir: Path
    pool_features: Callable[[], np.ndarray]
    params: dict[str, Any] = field(default_factory=dict)
    private_cache: Path | None = None
    progress: Progress = SILENT

    @property
    def out(self) -> Path:
        """The set file a mechanism writes for this cell (``workdir/synthetic.jsonl``)."""
        return self.workdir / SET_FILE


Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Method:
    """A training-set maker: its code (a callable, or ``"module:function"`` imported on first use), its
    privacy label, whether it takes ε, the parameters it accepts, a one-line ``summary`` (the README
    table), its name under ``privlm synth --method`` (``synth``; None: experiments only) and how that
    command runs it (``command``, :class:`privlm.synthesis.command.SynthCommand`; required with ``synth``)."""

    run: Callable[[MethodContext], Rows] | str
    privacy: str
    takes_epsilon: bool = False
    params: frozenset[str] = frozenset()
    summary: str = ""
    synth: str | None = None
    command: SynthCommand | None = None

    def __call__(self, ctx: MethodContext) -> Rows:
        """Make the cell's rows."""
        if isinstance(self.run, str):
            module, _, name = self.run.partition(":")
            return getattr(importlib.import_module(module), name)(ctx)
        return self.run(ctx)


METHODS: dict[str, Method] = {}


def register_method(name: str, method: Method) -> None:
    """Add (or replace) method ``name``; one with a ``privlm synth`` name needs its ``command``."""
    if (method.synth is None) != (method.command is None):
        raise ValueError(f"method {name!r}: give both synth= and command= (privlm synth runs it) or neither")
    METHODS[name] = method


def config_params(config: type, *extra: str) -> frozenset[str]:
    """The parameters of a method set by its config dataclass: the config's fields but ``seed`` (the cell's
    seed sets it), and ``extra``."""
    return frozenset({f.name for f in fields(config)} - {"seed"} | set(extra))


def load_methods() -> dict[str, Method]:
    """Import every method subpackage of :mod:`privlm.synthesis` (each registers itself); the registry."""
    import privlm.synthesis as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg:
            importlib.import_module(f"{package.__name__}.{info.name}")
    return METHODS


def base_name(name: str) -> str:
    """The registered method behind a method table's name: ``gradmm@top50`` → ``gradmm``."""
    return name.split("@", 1)[0]


def get_method(name: str) -> Method:
    """The method registered as ``name``; ``NAME@VARIANT`` (e.g. ``gradmm@top50``, an ablation with its
    own parameters in the same grid) is method ``NAME``."""
    base = base_name(name)
    if base not in METHODS:
        load_methods()
    if base not in METHODS:
        raise UserError(f"unknown method {base!r}; known: {', '.join(sorted(METHODS))}")
    return METHODS[base]


def synth_methods() -> dict[str, str]:
    """``privlm synth --method`` names → registered method names."""
    return {m.synth: name for name, m in load_methods().items() if m.synth is not None}


def synth_commands() -> dict[str, SynthCommand]:
    """``privlm synth --method`` names → their commands, in name order."""
    return {
        m.synth: m.command for _, m in sorted(load_methods().items()) if m.synth is not None and m.command is not None
    }


def methods_table() -> str:
    """The README's method table (Markdown), one row per registered method, in name order."""
    lines = ["| method | `privlm synth --method` | what | privacy |", "|---|---|---|---|"]
    for name, method in sorted(load_methods().items()):
        synth = f"`{method.synth}`" if method.synth else "–"
        lines.append(f"| `{name}` | {synth} | {method.summary} | {method.privacy} |")
    return "\n".join(lines) + "\n"
