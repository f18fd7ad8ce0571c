"""Randomized trace estimators for per-sample squared gradient norms (DP-SGD-RC).

For a per-sample gradient matrix ``M_i`` (rows × cols), ``‖M_i‖²_F = tr(M_i M_iᵀ)``. The operator
gives ``right(X) = M_iᵀ X`` (B, cols, k) and ``left(Y) = M_i Y_i`` (B, rows, k), so nothing of size
rows × cols is ever formed per sample.

Probes are Gaussian, drawn from the caller's ``torch.Generator`` (independent of the data) and fresh
at every call. Both estimators are unbiased: E[estimate] = ‖M_i‖²_F. Hutchinson with k probes
(entries N(0, 1/k)) has variance 2 Σ λ² / k, λ the eigenvalues of M_i M_iᵀ. Hutch++ (Meyer, Musco,
Musco, Woodruff 2021) with m probes: a sketch of ⌊m/3⌋ probes, QR, the exact trace on the sketched
head, and Hutchinson with m − 2⌊m/3⌋ ≥ ⌊m/3⌋ probes on the deflated tail. Conditional on the sketch the
tail is a Hutchinson estimate, which is what the privacy accounting of ``hutchpp`` relies on.
One probe matrix is shared by all samples of a batch and all uses of a parameter.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class SampleOperator(Protocol):
    """Per-sample matrices ``M_i`` (rows × cols) as a linear operator over a batch."""

    rows: int
    dtype: torch.dtype
    device: torch.device

    def right(self, x: Tensor) -> Tensor:
        """``M_iᵀ X`` (B, cols, k) for X (rows, k) or (B, rows, k)."""

    def left(self, y: Tensor) -> Tensor:
        """``M_i Y_i`` (B, rows, k) for Y (B, cols, k)."""


def gaussian_probes(op: SampleOperator, k: int, generator: torch.Generator) -> Tensor:
    """A (rows, k) matrix of N(0, 1) entries from ``generator``, in the operator's dtype and device."""
    probes = torch.randn(op.rows, k, generator=generator, device=generator.device, dtype=op.dtype)
    return probes.to(op.device)


def hutchinson(op: SampleOperator, k: int, generator: torch.Generator) -> Tensor:
    """Unbiased estimate (B,) of ``‖M_i‖²_F`` as ``‖M_iᵀ P‖²_F``, P (rows × k) with entries N(0, 1/k)."""
    if k < 1:
        raise ValueError(f"hutchinson needs k >= 1 probes, got {k}")
    probes = gaussian_probes(op, k, generator).mul_(k**-0.5)
    return op.right(probes).pow(2).sum((1, 2))


def hutchpp(op: SampleOperator, m: int, generator: torch.Generator) -> Tensor:
    """Unbiased Hutch++ estimate (B,) of ``‖M_i‖²_F`` with m ≥ 3 probes (see module docstring)."""
    if m < 3:
        raise ValueError(f"hutchpp needs m >= 3 probes, got {m}")
    k_sketch = m // 3
    k_tail = m - 2 * k_sketch
    sketch = gaussian_probes(op, k_sketch, generator)
    q, _ = torch.linalg.qr(op.left(op.right(sketch)))
    head = op.right(q).pow(2).sum((1, 2))
    tail_probes = gaussian_probes(op, k_tail, generator).mul_(k_tail**-0.5)
    deflated = tail_probes - q @ (q.transpose(1, 2) @ tail_probes)
    return head + op.right(deflated).pow(2).sum((1, 2))
