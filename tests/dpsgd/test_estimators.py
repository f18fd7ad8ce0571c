"""Hutchinson and Hutch++ on one layer's per-sample A, G: unbiased (≥ 2,000 draws, 3 standard errors),
Hutchinson's variance is 2Σλ²/k, and Hutch++ has lower variance on a low-rank case."""

from __future__ import annotations

import torch

from privlm.dpsgd.estimators import hutchinson, hutchpp, probe_columns
from privlm.dpsgd.norms import OuterFactor, ParameterOperator

DRAWS = 2000


def _layer(rank_boost: float = 0.0, seed: int = 0):
    """A linear layer's factors for 2 samples: G (B, T, p) and A (B, T, d); optionally a dominant rank-2 part."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(2, 16, 24, generator=gen, dtype=torch.float64)
    a = torch.randn(2, 16, 20, generator=gen, dtype=torch.float64)
    if rank_boost:
        u = torch.randn(2, 16, 2, generator=gen, dtype=torch.float64)
        g = 0.05 * g + rank_boost * u @ torch.randn(2, 24, generator=gen, dtype=torch.float64)
    op = ParameterOperator([OuterFactor(left=g, right=a, rows=24)])
    m = g.transpose(1, 2) @ a  # per-sample gradient (B, p, d), written out independently
    return op, m


def _draws(estimator, op, k: int) -> torch.Tensor:
    """DRAWS estimates, each with a fresh N(0, 1) probe matrix."""
    gen = torch.Generator().manual_seed(1)
    mode = estimator.__name__
    columns = probe_columns(mode, k)
    draws = []
    for _ in range(DRAWS):
        probes = torch.randn(op.rows, columns, generator=gen, dtype=op.dtype)
        draws.append(hutchinson(op, probes) if mode == "hutchinson" else hutchpp(op, k, probes))
    return torch.stack(draws)


def test_hutchinson_unbiased_with_variance_2_sum_lambda2_over_k():
    op, m = _layer()
    k = 4
    draws = _draws(hutchinson, op, k)
    exact = m.pow(2).sum((1, 2))
    se = draws.std(0) / DRAWS**0.5
    assert ((draws.mean(0) - exact).abs() <= 3 * se).all()
    eig = torch.linalg.eigvalsh(m @ m.transpose(1, 2))
    theory = 2 * eig.pow(2).sum(1) / k
    var = draws.var(0)
    centered = draws - draws.mean(0)
    se_var = ((centered.pow(4).mean(0) - var.pow(2)) / DRAWS).sqrt()
    assert ((var - theory).abs() <= 3 * se_var).all(), (var, theory, se_var)


def test_hutchpp_unbiased():
    op, m = _layer(rank_boost=0.0)
    draws = _draws(hutchpp, op, 6)
    exact = m.pow(2).sum((1, 2))
    se = draws.std(0) / DRAWS**0.5
    assert ((draws.mean(0) - exact).abs() <= 3 * se).all()


def test_hutchpp_beats_hutchinson_on_low_rank():
    op, m = _layer(rank_boost=3.0)
    exact = m.pow(2).sum((1, 2))
    hutch = _draws(hutchinson, op, 9)
    hpp = _draws(hutchpp, op, 9)
    se = hpp.std(0) / DRAWS**0.5
    assert ((hpp.mean(0) - exact).abs() <= 3 * se).all()
    assert (hpp.var(0) < 0.2 * hutch.var(0)).all(), (hpp.var(0), hutch.var(0))
