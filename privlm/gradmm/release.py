"""The one DP release of GRADMM: per class, the noisy sum of clipped last-layer gradients.

For a private example with final hidden state ``h`` (d) and next-token probabilities ``p`` (V) at the
last position, and label token ``y``, the gradient of the cross-entropy with respect to the LM-head
weight is rank one, ``g = (p − e_y) hᵀ`` (V × d), so ``‖g‖_F = ‖p − e_y‖·‖h‖``. Each ``g`` is clipped
to norm ``C`` *without forming it*, and per class ``c``::

    S_c = Σ_{i ∈ c} min(1, C/‖g_i‖) g_i + N(0, σ² C² I),      σ = gaussian_noise_multiplier(ε, δ).

Guarantee: under add/remove-one adjacency an example changes exactly one class's sum by at most ``C``
in L2, so the whole release (all classes together) is one Gaussian mechanism with sensitivity ``C``
and is (ε, δ)-DP (classes compose in parallel). Assumptions: labels are part of the record (replace-one
adjacency would need sensitivity √2·C, i.e. twice the ε budget); the noise comes from a fresh
256-bit OS key through :class:`privlm.randomness.SecureRandom` (ChaCha20, float64 Box–Muller from 53-bit
uniforms; its floating-point assumption is stated there); no private count is released (cosine matching is scale-free). ``dp=False`` skips clipping and noise
and the release says so.

Under ``torch.distributed`` each rank sums its shard of the examples, the clipped sums are all-reduced,
and the noise is drawn once on rank 0 and broadcast.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.atomic import atomic_path
from privlm.errors import UserError
from privlm.randomness import SecureRandom
from privlm.gradmm.prompt import Prompt, encode_text, head_logits, head_weight, last_hidden_from_ids
from privlm.privacy.gaussian import gaussian_noise_multiplier


@dataclass(frozen=True)
class Release:
    """Per-class targets ``S`` (K × V × d, float32 or wider) and how they were made (all of it public after release)."""

    targets: torch.Tensor
    prompt: Prompt
    dp: bool
    epsilon: float | None
    delta: float | None
    noise_multiplier: float | None
    clip: float | None
    max_tokens: int
    model_fingerprint: str
    meta: dict = field(default_factory=dict)

    def metadata(self) -> dict:
        """Everything but the tensor, JSON-able."""
        return {
            "prompt": self.prompt.to_dict(),
            "dp": self.dp,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip,
            "max_tokens": self.max_tokens,
            "model_fingerprint": self.model_fingerprint,
            "meta": self.meta,
        }

    def noise_norm(self) -> float | None:
        """Expected L2 norm of the noise in one class target, ``σ·C·√(V·d)`` (public); ``None`` without DP.

        A class's clipped sum of n examples has norm at most ``n·C``, so the signal can outweigh the noise
        only when ``n ≳ σ·√(V·d)`` examples per class; with fewer, the target is mostly noise and the
        generated text depends on it little. Measured: SmolLM2-135M (V·d = 28.3M), ε = 1 (σ = 3.73),
        50 examples per class: noise norm 19,800, ``cos(DP target, no-DP target)`` ≈ 0.002.
        """
        if not self.dp:
            return None
        return float(self.noise_multiplier * self.clip * self.targets[0].numel() ** 0.5)

    def sha256(self) -> str:
        """Hash of the released tensor and its metadata (identifies the release in outputs and ledgers)."""
        digest = hashlib.sha256(json.dumps(self.metadata(), sort_keys=True).encode())
        digest.update(self.targets.detach().contiguous().cpu().numpy().tobytes())
        return digest.hexdigest()

    def save(self, path: str | Path) -> None:
        """Write atomically (temp file + ``os.replace``): a reader never sees half a release."""
        with atomic_path(path) as tmp:
            torch.save({"targets": self.targets.contiguous(), "metadata": self.metadata()}, tmp)

    @classmethod
    def load(cls, path: str | Path) -> Release:
        """Read a release written by :meth:`save`."""
        try:
            blob = torch.load(path, weights_only=True)
        except (OSError, RuntimeError) as err:
            raise UserError(f"cannot read DP release {path}: {err}") from err
        meta = blob["metadata"]
        return cls(
            targets=blob["targets"],
            prompt=Prompt.from_dict(meta["prompt"]),
            dp=meta["dp"],
            epsilon=meta["epsilon"],
            delta=meta["delta"],
            noise_multiplier=meta["noise_multiplier"],
            clip=meta["clip"],
            max_tokens=meta["max_tokens"],
            model_fingerprint=meta["model_fingerprint"],
            meta=meta["meta"],
        )


def model_fingerprint(model: PreTrainedModel) -> str:
    """SHA-256 of the LM-head weight: a release is only meaningful for the model that made it."""
    weight = head_weight(model).detach().to(torch.float32).contiguous().cpu()
    return hashlib.sha256(weight.numpy().tobytes()).hexdigest()


def per_sample_factors(
    hidden: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals ``r = p − e_y`` (B × V) and per-sample gradient norms ``‖r‖·‖h‖`` (B)."""
    resid = probs.clone()
    resid[torch.arange(len(labels)), labels] -= 1.0
    return resid, resid.norm(dim=1) * hidden.norm(dim=1)


@torch.no_grad()
def clipped_class_sums(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, int]],
    prompt: Prompt,
    *,
    clip: float | None,
    max_tokens: int,
    batch_size: int = 16,
    on_batch: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """Σ_{i∈c} min(1, C/‖g_i‖) g_i per class (K × V × d), never forming a per-sample gradient.

    ``examples`` are ``(text, class_index)``; ``clip=None`` sums unclipped gradients. Under
    ``torch.distributed`` this rank takes ``examples[rank::world]`` and the sums are all-reduced.
    """
    weight = head_weight(model)
    n_classes = len(prompt.label_token_ids)
    dtype = torch.promote_types(weight.dtype, torch.float32)
    sums = torch.zeros(n_classes, *weight.shape, dtype=dtype)
    if dist.is_available() and dist.is_initialized():
        examples = list(examples)[dist.get_rank() :: dist.get_world_size()]
    label_tokens = torch.tensor(prompt.label_token_ids)
    for _, k in examples:
        if not 0 <= k < n_classes:
            raise UserError(f"label {k} out of range for {n_classes} classes")
    encoded = sorted(  # length-sorted batches waste little on padding; the sum does not depend on order
        ((encode_text(tokenizer, prompt, text, max_tokens), k) for text, k in examples), key=lambda e: len(e[0])
    )
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start : start + batch_size]
        seqs = [ids for ids, _ in chunk]
        hidden = last_hidden_from_ids(model, seqs)
        probs = torch.softmax(head_logits(model, hidden).to(dtype), dim=-1)
        hidden = hidden.to(dtype)
        classes = torch.tensor([k for _, k in chunk])
        resid, norms = per_sample_factors(hidden, probs, label_tokens[classes])
        if clip is not None:
            resid = resid * torch.clamp(clip / norms.clamp_min(1e-30), max=1.0)[:, None]
        for k in classes.unique().tolist():
            rows = classes == k
            sums[k] += resid[rows].T @ hidden[rows]
        if on_batch is not None:
            on_batch(len(chunk))
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    return sums


def add_gaussian_noise(sums: torch.Tensor, std: float) -> torch.Tensor:
    """``sums + N(0, std²)`` per coordinate, drawn once (rank 0, then broadcast under torch.distributed).

    Every call draws a fresh key from the OS (:meth:`SecureRandom.from_os`) and forgets it: the noise is
    reproducible from nothing, no user seed included."""
    distributed = dist.is_available() and dist.is_initialized()
    noisy = sums.clone()
    if not distributed or dist.get_rank() == 0:
        noisy += SecureRandom.from_os().normal(sums.shape, (0,), std=std, dtype=sums.dtype)
    if distributed:
        dist.broadcast(noisy, src=0)
    return noisy


def draw_release(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, int]],
    prompt: Prompt,
    *,
    epsilon: float | None,
    delta: float | None,
    clip: float = 1.0,
    dp: bool = True,
    max_tokens: int = 64,
    batch_size: int = 16,
    save_to: str | Path | None = None,
    meta: dict | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> Release:
    """Draw the (ε, δ)-DP per-class release from the private ``examples`` (see module docstring).

    If ``save_to`` is given the release is written there (atomically, rank 0 only) before this function
    returns, so a crash afterwards never leads to drawing it again.
    """
    if dp:
        if epsilon is None or delta is None or not epsilon > 0 or not 0 < delta < 1:
            raise UserError(f"need epsilon > 0 and 0 < delta < 1 for a DP release (got {epsilon}, {delta})")
        if not clip > 0:
            raise UserError(f"clip must be > 0 (got {clip})")
        sigma = gaussian_noise_multiplier(epsilon, delta)
    sums = clipped_class_sums(
        model, tokenizer, examples, prompt,
        clip=clip if dp else None, max_tokens=max_tokens, batch_size=batch_size, on_batch=on_batch,
    )
    targets = add_gaussian_noise(sums, sigma * clip) if dp else sums
    if not dp and bool((targets.flatten(1).norm(dim=1) == 0).any()):
        raise UserError("a class has no private examples; every class needs at least one for --no-dp")
    release = Release(
        targets=targets,
        prompt=prompt,
        dp=dp,
        epsilon=float(epsilon) if dp else None,
        delta=float(delta) if dp else None,
        noise_multiplier=float(sigma) if dp else None,
        clip=float(clip) if dp else None,
        max_tokens=max_tokens,
        model_fingerprint=model_fingerprint(model),
        meta=dict(meta or {}),
    )
    if save_to is not None and (not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0):
        release.save(save_to)
    return release
