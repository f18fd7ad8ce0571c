"""Experiment adapters of the real-data coresets (:func:`privlm.evaluation.coresets.select_per_class`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from privlm.evaluation.coresets import select_per_class
from privlm.synthesis.registry import MethodContext


def coreset_rows(kind: str, ctx: MethodContext) -> list[dict[str, Any]]:
    """``n_per_class`` pool examples per class chosen by coreset ``kind`` on the pool's features (``random``
    draws from the indices alone: it never computes them)."""
    labels = [y for _, y in ctx.pool]
    features = np.empty((len(ctx.pool), 0)) if kind == "random" else ctx.pool_features()
    picks = select_per_class(kind, features, labels, ctx.n_per_class, ctx.seed)
    return [{"text": ctx.pool[i][0], "label": ctx.pool[i][1], "pool_index": i} for i in picks]


def random_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """A random coreset."""
    return coreset_rows("random", ctx)


def herding_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """A herding coreset."""
    return coreset_rows("herding", ctx)


def k_center_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """A k-center coreset."""
    return coreset_rows("k-center", ctx)
