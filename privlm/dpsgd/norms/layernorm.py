"""``nn.LayerNorm``: weight gradient ``Σ_t G_t ∘ x̂_t``, bias gradient ``Σ_t G_t`` (cheap, exact)."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from privlm.dpsgd.norms.factors import DenseFactor, Factor
from privlm.dpsgd.norms.registry import register, trainable


@register(nn.LayerNorm, ("weight", "bias"))
def layernorm_factors(module: nn.LayerNorm, x: Tensor, grad: Tensor) -> dict[str, Factor]:
    """Per-sample gradients (B, *normalized_shape), from the normalised input x̂ recomputed here."""
    shape = tuple(module.normalized_shape)
    width = math.prod(shape)
    g = grad.reshape(grad.shape[0], -1, width)
    out: dict[str, Factor] = {}
    if trainable(module, "weight"):
        x_hat = F.layer_norm(x, shape, eps=module.eps).reshape(g.shape)
        out["weight"] = DenseFactor((g * x_hat).sum(1).reshape(-1, *shape))
    if trainable(module, "bias"):
        out["bias"] = DenseFactor(g.sum(1).reshape(-1, *shape))
    return out
