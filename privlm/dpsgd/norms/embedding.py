"""``nn.Embedding``: the weight gradient is ``onehot(ids)ᵀ G`` — factors keep the token ids, never a
vocabulary-sized one-hot. Positions holding ``padding_idx`` get no gradient (as in PyTorch)."""

from __future__ import annotations

from torch import Tensor, nn

from privlm.dpsgd.norms.factors import Factor, OuterFactor
from privlm.dpsgd.norms.registry import register, trainable


def _check(module: nn.Embedding) -> str | None:
    if module.max_norm is not None:
        return "max_norm renormalises the weight in place during the forward"
    if module.scale_grad_by_freq or module.sparse:
        return "scale_grad_by_freq / sparse gradients are not supported"
    return None


@register(nn.Embedding, ("weight",), check=_check)
def embedding_factors(module: nn.Embedding, ids: Tensor, grad: Tensor) -> dict[str, Factor]:
    """Weight (vocab × d): left = token ids (B, T), right = output gradients (B, T, d)."""
    if not trainable(module, "weight"):
        return {}
    ids = ids.reshape(ids.shape[0], -1)
    g = grad.reshape(ids.shape[0], ids.shape[1], module.embedding_dim)
    if module.padding_idx is not None:
        g = g * (ids != module.padding_idx)[:, :, None].to(g.dtype)
    return {"weight": OuterFactor(left=ids, right=g, rows=module.num_embeddings)}
