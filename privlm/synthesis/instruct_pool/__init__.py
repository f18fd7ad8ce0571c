"""``instruct-pool``: a seeded uniform draw of GRADMM's public candidate pool (the public LM's answers to each
class's instruction that the public label filter keeps) — the public baseline GRADMM's generate–select chooses
against; experiment adapter in :mod:`.method`."""

from __future__ import annotations

from privlm.synthesis.registry import PUBLIC, Method, register_method

register_method(
    "instruct-pool",
    Method(
        "privlm.synthesis.instruct_pool.method:instruct_pool_rows",
        PUBLIC,
        params=frozenset({"preset", "pool_seed", "batch", "oversample", "label_filter", "instruction", "instructions"}),
        summary="n of GRADMM's label-filtered instructed public candidates per class, drawn uniformly (no release)",
    ),
)
