"""Registry of the ways an experiment makes a training set of n examples per class.

A method maps a :class:`MethodContext` to rows (``text``, ``label``, extra fields kept in the cached
set). ``privacy`` says what the resulting set guarantees about the private pool; it is copied to every
results row. New methods are added with :func:`register_method` (one entry, no edit elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.evaluation.baselines import Sampling, few_shot, zero_shot
from privlm.evaluation.config import FULL_POOL, base_name
from privlm.evaluation.coresets import select_per_class
from privlm.evaluation.scoring import Example

PUBLIC = "public: sees no private data"
NON_PRIVATE = "NON-PRIVATE: uses private examples directly"


@dataclass
class MethodContext:
    """What a method may use. ``pool`` is the private pool; DP methods must touch it only through
    their own private mechanism. ``pool_features()`` gives the base model's last-token features of the
    pool (computed once per experiment). ``workdir`` is a folder reserved for this cell; ``private_cache``
    a folder shared by the experiment's cells for what is computed once from the pool (PRIVATE: as
    sensitive as the pool, never published)."""

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


@dataclass(frozen=True)
class Method:
    """A training-set maker, its privacy label, whether it takes ε, and the parameters it accepts."""

    run: Callable[[MethodContext], list[dict[str, Any]]]
    privacy: str
    takes_epsilon: bool = False
    params: frozenset[str] = frozenset()


METHODS: dict[str, Method] = {}


def register_method(name: str, method: Method) -> None:
    """Add (or replace) method ``name``."""
    METHODS[name] = method


def get_method(name: str) -> Method:
    """The method registered as ``name``; ``NAME@VARIANT`` (e.g. ``gradmm@top50``, an ablation with its
    own parameters in the same grid) is method ``NAME``."""
    base = base_name(name)
    if base not in METHODS:
        raise UserError(f"unknown method {base!r}; known: {', '.join(sorted(METHODS))}")
    return METHODS[base]


def _sampling(params: dict[str, Any]) -> Sampling:
    return Sampling(**{k: params[k] for k in ("max_new_tokens", "temperature", "top_p") if k in params})


def _zero_shot(ctx: MethodContext) -> list[dict[str, Any]]:
    return zero_shot(
        ctx.model, ctx.tokenizer, ctx.label_names, ctx.n_per_class, ctx.seed,
        instructions=ctx.params.get("instructions"), sampling=_sampling(ctx.params),
    )


def _few_shot(ctx: MethodContext) -> list[dict[str, Any]]:
    return few_shot(
        ctx.model, ctx.tokenizer, ctx.pool, ctx.label_names, ctx.n_per_class, int(ctx.params.get("k", 3)), ctx.seed,
        instructions=ctx.params.get("instructions"), sampling=_sampling(ctx.params),
    )


def _coreset(kind: str) -> Callable[[MethodContext], list[dict[str, Any]]]:
    def run(ctx: MethodContext) -> list[dict[str, Any]]:
        labels = [y for _, y in ctx.pool]
        picks = select_per_class(kind, ctx.pool_features(), labels, ctx.n_per_class, ctx.seed)
        return [{"text": ctx.pool[i][0], "label": ctx.pool[i][1], "pool_index": i} for i in picks]

    return run


def _full_pool(ctx: MethodContext) -> list[dict[str, Any]]:
    return [{"text": text, "label": label, "pool_index": i} for i, (text, label) in enumerate(ctx.pool)]


GENERATION_PARAMS = frozenset({"instructions", "max_new_tokens", "temperature", "top_p"})
register_method("zero-shot", Method(_zero_shot, PUBLIC, params=GENERATION_PARAMS))
register_method(
    "few-shot", Method(_few_shot, NON_PRIVATE + " (k private examples in every prompt)", params=GENERATION_PARAMS | {"k"})
)
for _kind in ("random", "herding", "k-center"):
    register_method(_kind, Method(_coreset(_kind), NON_PRIVATE + f" ({_kind} coreset of real examples)"))
register_method(FULL_POOL, Method(_full_pool, NON_PRIVATE + " (the whole pool; upper reference)"))
