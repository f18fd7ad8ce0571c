"""ADMM over the token embeddings of one synthetic batch.

Solves ``min_X f(X)  s.t.  X = Z, Z ∈ vocabulary embeddings`` with, per outer step::

    Z = Proj(X + Λ/ρ)                                         (z-step: projection onto tokens)
    X ← `inner_steps` Adam steps on f(X) + ρ/2 ‖X − Z + Λ/ρ‖²  (x-step)
    Λ ← Λ + ρ (X − Z)                                          (dual step)

keeping the iterate with the lowest ``f`` seen and projecting it at the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from privlm.synthesis.gradmm.projection import Projector


@dataclass(frozen=True)
class AdmmResult:
    """Final token ids (B × L) and the best continuous objective value seen."""

    ids: torch.Tensor
    best_loss: float


def run_admm(
    objective: Callable[[torch.Tensor], torch.Tensor],
    projector: Projector,
    x0: torch.Tensor,
    *,
    rho: float,
    lr: float,
    outer_steps: int,
    inner_steps: int,
    on_step: Callable[[int, int, float], None] | None = None,
) -> AdmmResult:
    """Run ADMM from embeddings ``x0`` (B × L × d); ``objective`` maps X to the scalar matching loss.

    ``on_step(outer, inner, loss)`` is called after every x-step (progress reporting).
    """
    x = x0.detach().clone().requires_grad_(True)
    dual = torch.zeros_like(x0)
    opt = torch.optim.Adam([x], lr=lr)
    best_loss, best_x = float("inf"), x0.detach().clone()
    for outer in range(outer_steps):
        z = projector.embed(projector(x.detach() + dual / rho)).to(x.dtype)
        for inner in range(inner_steps):
            opt.zero_grad(set_to_none=True)
            match = objective(x)
            loss = match + 0.5 * rho * (x - z + dual / rho).pow(2).sum()
            loss.backward()
            if match.item() < best_loss:
                best_loss, best_x = match.item(), x.detach().clone()
            opt.step()
            if on_step is not None:
                on_step(outer, inner, match.item())
        dual += rho * (x.detach() - z)
    return AdmmResult(ids=projector(best_x), best_loss=best_loss)
