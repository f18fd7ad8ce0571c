"""Randomized trace estimators for per-sample squared gradient norms (DP-SGD-RC).

For a per-sample gradient matrix ``M_i`` (rows × cols), ``‖M_i‖²_F = tr(M_i M_iᵀ)``. The operator
gives ``right(X) = M_iᵀ X`` (B, cols, k) and ``left(Y) = M_i Y_i`` (B, rows, k), so nothing of size
rows × cols is ever formed per sample.

Probes are Gaussian N(0, 1) matrices given by the caller (drawn independently of the data; see
:class:`privlm.dpsgd.clipping.PerSampleClipper` for which draw serves which samples). Both estimators are unbiased: E[estimate] = ‖M_i‖²_F. Hutchinson with k probes
(entries N(0, 1/k)) has variance 2 Σ λ² / k, λ the eigenvalues of M_i M_iᵀ. Hutch++ (Meyer, Musco,
Musco, Woodruff 2021) with m probes: a sketch of ⌊m/3⌋ probes, QR, the exact trace on the sketched
head, and Hutchinson with m − 2⌊m/3⌋ ≥ ⌊m/3⌋ probes on the deflated tail. Conditional on the sketch the
tail is a Hutchinson estimate, which is what the privacy accounting of ``hutchpp`` relies on.
One probe matrix serves all samples of a logical step and all uses of a parameter.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from privlm.norm_modes import check_probes, norm_mode


class SampleOperator(Protocol):
    """Per-sample matrices ``M_i`` (rows × cols) as a linear operator over a batch."""

    rows: int
    dtype: torch.dtype
    device: torch.device

    def right(self, x: Tensor) -> Tensor:
        """``M_iᵀ X`` (B, cols, k) for X (rows, k) or (B, rows, k)."""

    def left(self, y: Tensor) -> Tensor:
        """``M_i Y_i`` (B, rows, k) for Y (B, cols, k)."""


def probe_columns(mode: str, probes: int) -> int:
    """Columns of the N(0, 1) matrix a randomized mode consumes (its registry entry's
    ``probe_columns``): k for ``hutchinson``, the ⌊m/3⌋ sketch and m − 2⌊m/3⌋ tail columns for
    ``hutchpp``. Raises ``ValueError`` for an exact mode or too few probes."""
    spec = norm_mode(mode)
    if spec.probe_columns is None:
        raise ValueError(f"{mode!r} is not a randomized norm mode")
    return spec.probe_columns(check_probes(mode, probes))


def hutchinson(op: SampleOperator, probes: Tensor) -> Tensor:
    """Unbiased estimate (B,) of ``‖M_i‖²_F`` as ``‖M_iᵀ P‖²_F``, P = ``probes``/√k (rows × k, N(0, 1) given)."""
    return op.right(probes.to(op.dtype)).pow(2).sum((1, 2)) / probes.shape[1]


def hutchpp(op: SampleOperator, m: int, probes: Tensor) -> Tensor:
    """Unbiased Hutch++ estimate (B,) of ``‖M_i‖²_F`` with m ≥ 3 probes (see module docstring);
    ``probes``: (rows × :func:`probe_columns`) N(0, 1), the first ⌊m/3⌋ columns the sketch."""
    k_sketch = m // 3
    k_tail = m - 2 * k_sketch
    if probes.shape[1] != k_sketch + k_tail:
        raise ValueError(f"hutchpp with m = {m} needs {k_sketch + k_tail} probe columns, got {probes.shape[1]}")
    probes = probes.to(op.dtype)
    sketch = probes[:, :k_sketch]
    q, _ = torch.linalg.qr(op.left(op.right(sketch)))
    head = op.right(q).pow(2).sum((1, 2))
    tail_probes = probes[:, k_sketch:]
    deflated = tail_probes - q @ (q.transpose(1, 2) @ tail_probes)
    return head + op.right(deflated).pow(2).sum((1, 2)) / k_tail
