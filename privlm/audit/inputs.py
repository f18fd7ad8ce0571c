"""Black-box input canaries for DP-SGD: random-token texts ending in a random "label" token, trained
into a model (the tiny Llama, or SmolLM2 with LoRA adapters); the score is how much the final model's
loss on a canary fell from the initial model's (both models are public to this auditor, the training
data and steps are not). An excluded canary's slot holds a null row (one token, no target, loss 0),
so N and q do not depend on the inclusion bits.

These canaries are ordinary data: their gradients are whatever the model makes of them, so they test
the mechanism as a user's data meets it, and are far weaker than :mod:`privlm.audit.gradient`'s.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np
import torch

from privlm.audit.outcome import CanaryOutcome, inclusion_bits
from privlm.audit.scale import Scale
from privlm.audit.training import RunSettings, cell_settings, null_mask, train_private
from privlm.dpsgd.losses import causal_lm_losses
from privlm.errors import UserError
from privlm.resources.models import load_model
from privlm.training.run import with_lora


@torch.no_grad()
def text_losses(model: torch.nn.Module, texts: torch.Tensor, batch_size: int = 256) -> np.ndarray:
    """Mean token loss of every row of ``texts`` (N × T token ids, no padding) under ``model``."""
    mask = torch.ones_like(texts)
    parts = [
        causal_lm_losses(
            model, {"input_ids": texts[i : i + batch_size], "attention_mask": mask[i : i + batch_size]}, "mean"
        )
        for i in range(0, len(texts), batch_size)
    ]
    return torch.cat(parts).double().numpy()


@dataclass(frozen=True)
class InputCanaries:
    """m random-token canary texts of ``seq_len`` tokens (the last is the random label), trained with
    ``real_examples`` other random texts into ``model`` (a registered name); ``lora_rank`` > 0 trains
    LoRA adapters of that rank only, on the last ``lora_layers`` blocks (None: all)."""

    canaries: int = 1000
    real_examples: int = 0
    seq_len: int = 8
    model: str = "tiny-llama"
    lora_rank: int = 0
    lora_layers: int | None = None

    def run(self, settings: RunSettings) -> CanaryOutcome:
        """Insert, train once, score every canary by its loss drop."""
        if self.canaries < 2 or self.seq_len < 2:
            raise UserError(f"need >= 2 canaries of >= 2 tokens, got {self.canaries} of {self.seq_len}")
        included = inclusion_bits(self.canaries, settings.seed)
        model, tokenizer = load_model(self.model, seed=settings.seed)
        if self.lora_rank:
            model = with_lora(model, self.lora_rank, settings.seed, self.lora_layers)
        gen = torch.Generator().manual_seed(settings.seed + 1)
        texts = torch.randint(1, len(tokenizer), (self.canaries + self.real_examples, self.seq_len), generator=gen)
        before = text_losses(model, texts[: self.canaries])
        ones = torch.ones(self.seq_len, dtype=torch.long)
        first = null_mask(self.seq_len)  # an excluded canary's slot: one token, no target, loss 0
        masks = [ones if inside else first for inside in included] + [ones] * self.real_examples
        examples = [{"input_ids": row, "attention_mask": mask} for row, mask in zip(texts, masks)]
        run = train_private(model, examples, functools.partial(causal_lm_losses, reduction="mean"), settings)
        after = text_losses(model, texts[: self.canaries])
        return CanaryOutcome(
            scores=before - after,
            included=included,
            accounted_epsilon=run.accounted_epsilon,
            delta=settings.delta,
            details={
                "noise_multiplier": run.noise_multiplier,
                "sample_rate": run.sample_rate,
                "steps": run.steps,
                "real_examples": self.real_examples,
                "model": self.model,
                "lora_rank": self.lora_rank,
                "lora_layers": self.lora_layers,
            },
        )


def run_blackbox(mode: str, epsilon: float, scale: Scale, delta: float, seed: int) -> CanaryOutcome:
    """Audit entry point ``dpsgd-blackbox``: DP-SGD on the tiny model with random-text canaries."""
    return InputCanaries(canaries=scale.canaries).run(cell_settings(mode, epsilon, scale, delta, seed))


def run_smollm2(mode: str, epsilon: float, scale: Scale, delta: float, seed: int) -> CanaryOutcome:
    """Audit entry point ``smollm2-blackbox``: DP-SGD with LoRA r = 8 on SmolLM2's last 2 blocks, input canaries."""
    settings = replace(
        cell_settings(mode, epsilon, scale, delta, seed), steps=scale.smollm2_steps, physical_batch_size=64
    )
    smollm2 = InputCanaries(canaries=scale.smollm2_canaries, model="smollm2-135m", lora_rank=8, lora_layers=2)
    return smollm2.run(settings)
