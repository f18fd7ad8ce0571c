"""Hugging Face GPT-2 ``Conv1D`` (``y = x W + b``, W of shape in × out): weight gradient ``Aᵀ G``."""

from __future__ import annotations

from torch import Tensor
from transformers.pytorch_utils import Conv1D

from privlm.dpsgd.norms.factors import DenseFactor, Factor, OuterFactor
from privlm.dpsgd.norms.registry import register, tokens, trainable


@register(Conv1D, ("weight", "bias"))
def conv1d_factors(module: Conv1D, x: Tensor, grad: Tensor) -> dict[str, Factor]:
    """Weight (in × out) = Σ_t A_tᵀ G_t: rows = input features (left = A), cols = output features."""
    n_in, n_out = module.weight.shape
    a = tokens(x, n_in)
    g = tokens(grad, n_out)
    out: dict[str, Factor] = {}
    if trainable(module, "weight"):
        out["weight"] = OuterFactor(left=a, right=g, rows=n_in)
    if trainable(module, "bias"):
        out["bias"] = DenseFactor(g.sum(1))
    return out
