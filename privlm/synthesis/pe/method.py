"""The ``pe`` experiment method: Private Evolution (:mod:`privlm.synthesis.pe`), one run per cell.

The private pool enters only through PE's noisy vote histograms; the run lives in the cell's
``workdir`` and is always resumed (a saved histogram is reused, never redrawn). The pool's embeddings
are computed once per experiment and kept in ``ctx.private_cache`` (private). Parameters (TOML
``[methods.pe]``): any :class:`privlm.synthesis.pe.PEConfig` field but ``seed`` (the cell's seed), and
``noise_only = true`` (e.g. ``[methods."pe@noise"]`` with the same parameters): its noise-only control, the
same run with histograms of pure noise at the cell's ε's σ, reading nothing private.
"""

from __future__ import annotations

from typing import Any

from privlm.digest import digest
from privlm.synthesis.pe.config import PEConfig
from privlm.synthesis.pe.mechanism import run_pe
from privlm.synthesis.registry import MethodContext


def pe_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """``n_per_class`` PE examples per class at the cell's ε (no noise, NOT private, when ε is 'none')."""
    params = dict(ctx.params)
    noise_only = bool(params.pop("noise_only", False))
    config = PEConfig(**{**params, "seed": ctx.seed})
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    cache = (
        None
        if ctx.private_cache is None
        else ctx.private_cache
        / (
            "pe-embeddings-"
            + digest({"pooling": config.pooling, "max_tokens": config.max_tokens, "shape": "width-buckets"})
            + ".npz"
        )
    )
    result = run_pe(
        ctx.model,
        ctx.tokenizer,
        ctx.label_names,
        lambda: list(ctx.pool),
        out=ctx.out,
        per_class=ctx.n_per_class,
        config=config,
        epsilon=ctx.epsilon,
        delta=ctx.delta if ctx.epsilon is not None else None,
        resume=True,
        noise_only=noise_only,
        embedding_cache=cache,
        progress=ctx.progress,
    )
    return [{**row, "epsilon_spent": result.privacy["epsilon"]} for row in result.rows]
