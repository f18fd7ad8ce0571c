"""``nn.Linear`` (with or without bias): weight gradient ``Gᵀ A``, bias gradient ``Σ_t G_t``."""

from __future__ import annotations

from torch import Tensor, nn

from privlm.dpsgd.norms.factors import DenseFactor, Factor, OuterFactor
from privlm.dpsgd.norms.registry import register, tokens, trainable


@register(nn.Linear, ("weight", "bias"))
def linear_factors(module: nn.Linear, x: Tensor, grad: Tensor) -> dict[str, Factor]:
    """Weight (out × in) = Σ_t G_tᵀ A_t: rows = output features (left = G), cols = input features."""
    a = tokens(x, module.in_features)
    g = tokens(grad, module.out_features)
    out: dict[str, Factor] = {}
    if trainable(module, "weight"):
        out["weight"] = OuterFactor(left=g, right=a, rows=module.out_features)
    if trainable(module, "bias"):
        out["bias"] = DenseFactor(g.sum(1))
    return out
