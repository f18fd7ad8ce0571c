"""Gradient-matching loss ``1 − cos(S, G_syn)`` in closed form (no double backward).

For a synthetic batch of B sequences of one class with label token ``y``, final hidden states ``H``
(B × d) and last-position probabilities ``P`` (B × V), the LM-head gradient of the summed cross-entropy
is ``G = Σ_j r_j h_jᵀ`` with ``r_j = p_j − e_y``. Then, without forming the V × d matrix ``G``::

    ⟨S, G⟩ = Σ_j r_j · (S h_j)          ‖G‖² = Σ_jk (r_j · r_k)(h_j · h_k)

so the loss and its gradient with respect to the input embeddings need one ordinary backward pass.
With ``rows`` (the release's public subspace, e.g. the label-token rows) both ``G`` and the target are
restricted to those rows of the V × d gradient: ``r_j`` becomes ``(p_j − e_y)_R`` and the target is |R| × d.
:func:`autograd_matching_loss` is the textbook double-backward version, kept as the reference that the
tests and ``benchmarks/gradmm_step.py`` compare against.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def residuals(logits: torch.Tensor, label_token: int, rows: Sequence[int] | None) -> torch.Tensor:
    """``(softmax(logits) − e_label)`` (B × V), restricted to the released ``rows`` (B × |R|) when given."""
    resid = torch.softmax(logits, dim=-1)
    onehot = torch.zeros_like(resid)
    onehot[:, label_token] = 1.0
    return resid - onehot if rows is None else (resid - onehot)[:, list(rows)]


def matching_loss(
    hidden: torch.Tensor,
    logits: torch.Tensor,
    label_token: int,
    target: torch.Tensor,
    rows: Sequence[int] | None = None,
) -> torch.Tensor:
    """``1 − cos(target, Σ_j (p_j − e_y)_R h_jᵀ)`` for hidden (B × d), logits (B × V), target (|R| × d)."""
    resid = residuals(logits, label_token, rows)
    inner = (resid * (hidden @ target.T)).sum()
    gram = ((resid @ resid.T) * (hidden @ hidden.T)).sum()
    return cosine_loss(inner, gram, target)


def cosine_loss(inner: torch.Tensor, squared_norm: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 − ⟨S, G⟩ / (‖G‖ ‖S‖)`` from the inner product ``inner`` = ⟨S, G⟩ and ``squared_norm`` = ‖G‖² (any
    matching shapes), for the target ``S``: the loss the closed forms above lead to."""
    return 1.0 - inner / (squared_norm.clamp_min(1e-30).sqrt() * target.norm())


def per_example_matching_loss(
    hidden: torch.Tensor,
    logits: torch.Tensor,
    label_token: int,
    target: torch.Tensor,
    rows: Sequence[int] | None = None,
) -> torch.Tensor:
    """``1 − cos(target, (p_j − e_y)_R h_jᵀ)`` for each example j of the batch (B)."""
    resid = residuals(logits, label_token, rows)
    inner = (resid * (hidden @ target.T)).sum(dim=1)
    return 1.0 - inner / (resid.norm(dim=1) * hidden.norm(dim=1) * target.norm()).clamp_min(1e-30)


def autograd_matching_loss(
    hidden: torch.Tensor, weight: torch.Tensor, label_token: int, target: torch.Tensor
) -> torch.Tensor:
    """Reference: ``G = ∂ Σ_j CE(W h_j, y) / ∂W`` by autograd (``create_graph=True``), then ``1 − cos``.

    ``weight`` is the LM-head weight (V × d); backpropagating the result differentiates through the
    first backward (double backward).
    """
    leaf = weight.detach().requires_grad_(True)
    logits = hidden @ leaf.T
    labels = torch.full((hidden.shape[0],), label_token, dtype=torch.long, device=hidden.device)
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    (grad,) = torch.autograd.grad(ce, leaf, create_graph=True)
    return 1.0 - torch.nn.functional.cosine_similarity(grad.flatten(), target.flatten(), dim=0)
