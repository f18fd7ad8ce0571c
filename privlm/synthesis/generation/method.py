"""Experiment adapters of the generation baselines (:mod:`privlm.synthesis.generation.baselines`)."""

from __future__ import annotations

from typing import Any

from privlm.lm.sampling import Sampling
from privlm.synthesis.generation.baselines import few_shot, zero_shot
from privlm.synthesis.registry import MethodContext


def zero_shot_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """``n_per_class`` generations per class from the public instructions only, kept piece by piece in the
    cell's ``samples/`` folder (a rerun of an interrupted cell resumes)."""
    return zero_shot(
        ctx.model,
        ctx.tokenizer,
        ctx.label_names,
        ctx.n_per_class,
        ctx.seed,
        instructions=ctx.params.get("instructions"),
        sampling=Sampling.from_params(ctx.params),
        keep=ctx.workdir / "samples",
        progress=ctx.progress,
    )


def few_shot_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """``n_per_class`` generations per class, each prompted with ``k`` private examples (NOT private)."""
    return few_shot(
        ctx.model,
        ctx.tokenizer,
        ctx.pool,
        ctx.label_names,
        ctx.n_per_class,
        int(ctx.params.get("k", 3)),
        ctx.seed,
        instructions=ctx.params.get("instructions"),
        sampling=Sampling.from_params(ctx.params),
    )
