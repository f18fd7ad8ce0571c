"""Experiment adapters of the real-data coresets (:func:`privlm.synthesis.coresets.selection.select_per_class`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from privlm.synthesis.coresets.selection import USES_FEATURES, select_per_class
from privlm.synthesis.registry import MethodContext


def coreset_rows(kind: str, ctx: MethodContext) -> list[dict[str, Any]]:
    """``n_per_class`` pool examples per class chosen by coreset ``kind`` on the pool's features (computed
    only for the kinds that use them, :data:`~privlm.synthesis.coresets.selection.USES_FEATURES`)."""
    labels = [y for _, y in ctx.pool]
    features = ctx.pool_features() if kind in USES_FEATURES else np.empty((len(ctx.pool), 0))
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
