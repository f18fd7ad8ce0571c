"""Shared harness for the DP-SGD tests: tiny models, padded/masked batches, and the independent
reference — a loop over micro-batches of one sample (padding stripped) with plain autograd."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from privlm.dpsgd.losses import IGNORE_INDEX
from privlm.resources.tiny import build_tiny_model


def tiny_model(name: str, lora: bool = False, seed: int = 0, untied: bool = False) -> nn.Module:
    """A float64 tiny model; with ``lora``, peft LoRA adapters (all else frozen) with a non-zero B;
    with ``untied``, the LM head gets its own copy of the embedding matrix."""
    model, _ = build_tiny_model(name, seed=seed, dtype=torch.float64)
    if untied:
        head = model.get_output_embeddings()
        head.weight = nn.Parameter(head.weight.detach().clone() + 0.01)
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "v_proj", "down_proj"] if name == "tiny-llama" else ["c_attn", "c_proj"]
        config = LoraConfig(
            r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, fan_in_fan_out=name == "tiny-gpt2"
        )
        model = get_peft_model(model, config)
        gen = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    model.eval()
    return model


def padded_batch(lengths: list[int], seq_len: int = 12, vocab: int = 512, seed: int = 0, pad_id: int = 0) -> dict:
    """Right-padded random batch; labels mask the first two tokens (a 'prompt') with ignore_index.
    Token ids include ``pad_id`` inside the real text as well (the tiny models' pad = eos)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), seq_len), generator=gen)
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
        ids[i, n:] = pad_id
    ids[0, 1] = pad_id
    labels = ids.clone()
    labels[:, :2] = IGNORE_INDEX
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def reference_grads(model: nn.Module, batch: dict, reduction: str = "sum") -> list[list[torch.Tensor]]:
    """Per-sample gradients of every distinct trainable parameter, one sample at a time, unpadded,
    with PyTorch's cross-entropy (sum or mean over non-ignored targets): no engine code involved."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for i in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][i].sum())
        one = {k: v[i : i + 1, :n] for k, v in batch.items()}
        logits = model(input_ids=one["input_ids"]).logits[0, :-1]
        loss = F.cross_entropy(logits, one["labels"][0, 1:], ignore_index=IGNORE_INDEX, reduction=reduction)
        out.append([g.detach() for g in torch.autograd.grad(loss, params)])
    return out


def reference_sq_norms(grads: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.stack([sum(g.pow(2).sum() for g in sample) for sample in grads])


def reference_clipped_sum(grads: list[list[torch.Tensor]], max_grad_norm: float) -> list[torch.Tensor]:
    """Σ_i min(1, C/‖g_i‖) g_i, written out independently of the engine."""
    norms = reference_sq_norms(grads).sqrt()
    total = [torch.zeros_like(g) for g in grads[0]]
    for sample, n in zip(grads, norms):
        c = min(1.0, max_grad_norm / float(n))
        total = [t + c * g for t, g in zip(total, sample)]
    return total
