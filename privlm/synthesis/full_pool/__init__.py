"""``full-pool``: the whole private pool (NON-PRIVATE upper reference; ignores n)."""

from __future__ import annotations

from typing import Any

from privlm.synthesis.registry import NON_PRIVATE, Method, MethodContext, register_method


def full_pool_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """Every pool example."""
    return [{"text": text, "label": label, "pool_index": i} for i, (text, label) in enumerate(ctx.pool)]


register_method(
    "full-pool",
    Method(
        full_pool_rows,
        NON_PRIVATE + " (the whole pool; upper reference)",
        summary="every private example (the upper reference)",
    ),
)
