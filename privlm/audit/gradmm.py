"""Canaries for GRADMM's release: the per-class noisy sum of clipped LM-head gradients in the released
rows (:func:`privlm.gradmm.release.draw_release`, one Gaussian mechanism with sensitivity C).

Canary i is a private example (a random-token text with a random class); the release is drawn by the
library's own :func:`~privlm.gradmm.release.draw_release` from the included canaries (fresh OS noise
key, as in ``privlm synth``). The auditor, who knows the public model, computes every canary's clipped
gradient ĝ_i in the released rows (:func:`~privlm.gradmm.release.factor_class_sums` of that example
alone) and scores it by ⟨S_c, ĝ_i − ḡ_c⟩ / C², S_c the released target of its class and ḡ_c the mean
clipped gradient of that class's canaries (removing the component every canary shares, which would
otherwise drown each canary's own contribution). LM-head gradients of different texts are far from
orthogonal (g = (p − e_y) hᵀ with d-dimensional h), so the canaries interfere and this audit is weak.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from privlm.audit.outcome import CanaryOutcome, inclusion_bits
from privlm.errors import UserError
from privlm.gradmm.prompt import build_prompt
from privlm.gradmm.release import PrivateFactors, draw_release, factor_class_sums, private_factors, released_rows
from privlm.privacy.gaussian import gaussian_epsilon
from privlm.resources.tiny import build_tiny_model

LABEL_WORDS = ("bad", "great")


@dataclass(frozen=True)
class GradmmCanaries:
    """m canary texts of ``tokens`` random tokens in a tiny Llama of width ``hidden_size``; ``release``:
    which LM-head rows are released (``label-rows`` or ``full``, as ``privlm synth --release``)."""

    canaries: int = 256
    tokens: int = 8
    hidden_size: int = 64
    release: str = "label-rows"

    def run(self, epsilon: float, delta: float, clip: float = 1.0, seed: int = 0) -> CanaryOutcome:
        """Draw one release from the included canaries and score every canary (module docstring)."""
        if self.canaries < 2:
            raise UserError(f"need >= 2 canaries, got {self.canaries}")
        included = inclusion_bits(self.canaries, seed)
        model, tokenizer = build_tiny_model("tiny-llama", seed=seed, hidden_size=self.hidden_size)
        prompt = build_prompt(tokenizer, " It was ", LABEL_WORDS)
        gen = torch.Generator().manual_seed(seed + 2)
        ids = torch.randint(1, len(tokenizer), (self.canaries, self.tokens), generator=gen)
        labels = torch.randint(0, len(LABEL_WORDS), (self.canaries,), generator=gen).tolist()
        texts = [tokenizer.decode(row) for row in ids.tolist()]
        examples = list(zip(texts, labels))
        rows = released_rows(prompt, self.release)
        single = [private_factors(model, tokenizer, [e], prompt, max_tokens=self.tokens) for e in examples]
        chosen = [f for f, keep in zip(single, included) if keep]
        factors = (PrivateFactors(torch.cat([f.hidden for f in chosen]), torch.cat([f.labels for f in chosen]))
                   if chosen else None)  # no canary in: the library's noise-only release (reads no data)
        release = draw_release(model, prompt, factors, epsilon=epsilon, delta=delta, clip=clip, rows=rows,
                               max_tokens=self.tokens)
        grads = torch.stack([factor_class_sums(model, f, prompt, clip=clip, rows=rows)[k]
                             for f, k in zip(single, labels)]).double()
        classes = torch.tensor(labels)
        for k in range(len(LABEL_WORDS)):
            grads[classes == k] -= grads[classes == k].mean(0)
        targets = release.targets.double()[classes]
        scores = (grads * targets).flatten(1).sum(1) / clip**2
        return CanaryOutcome(
            scores=scores.numpy(),
            included=included,
            accounted_epsilon=gaussian_epsilon(release.noise_multiplier, delta),
            delta=delta,
            details={"noise_multiplier": release.noise_multiplier, "hidden_size": self.hidden_size,
                     "release": self.release},
        )
