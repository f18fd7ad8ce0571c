"""Llama's ``LlamaRMSNorm`` (``y = w ∘ x̂``, x̂ computed in float32 as the layer does): weight
gradient ``Σ_t G_t ∘ x̂_t`` (cheap, exact)."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from privlm.dpsgd.norms.factors import DenseFactor, Factor
from privlm.dpsgd.norms.registry import register, trainable


def _normalised(module: LlamaRMSNorm, x: Tensor) -> Tensor:
    """x̂ exactly as ``LlamaRMSNorm.forward`` computes it before the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)
    return h.to(x.dtype)


@register(LlamaRMSNorm, ("weight",))
def rmsnorm_factors(module: LlamaRMSNorm, x: Tensor, grad: Tensor) -> dict[str, Factor]:
    """Per-sample weight gradients (B, d)."""
    if not trainable(module, "weight"):
        return {}
    width = module.weight.shape[-1]
    x_hat = _normalised(module, x).reshape(x.shape[0], -1, width)
    g = grad.reshape(x_hat.shape)
    return {"weight": DenseFactor((g * x_hat).sum(1))}
