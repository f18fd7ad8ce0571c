"""Canaries for GRADMM's release: the per-class noisy sum of clipped LM-head gradients in the released
rows (:func:`privlm.synthesis.gradmm.release.draw_release`, one Gaussian mechanism with sensitivity C).

White-box canaries, as the DP-SGD gradient canaries: canary i is a private example whose factor — the
final hidden state h_i the release reads (:class:`~privlm.synthesis.gradmm.release.PrivateFactors`) — is crafted
as ``norm``·C·e_{j_i}, with class y_i = i mod K and hidden coordinate j_i = ⌊i/K⌋ (the tiny Llama is
built with hidden width ⌈m/K⌉, so every canary of a class has a coordinate of its own). Its gradient in
the released rows R, g_i = (p_i − e_{y_i})_R h_iᵀ (p_i from the public head), has norm ≈ ``norm``·C and
is clipped to C by the release: the canaries are m mutually orthogonal directions of norm C, each in its
class's sum, the worst case the sensitivity-C analysis covers. The release is drawn by the library's own
``draw_release`` from the included canaries' factors (fresh OS noise key, as in ``privlm synth``: this
cell is the one audit run that is not reproducible). The score of canary i is the release's component
along its own unit direction, ⟨S_{y_i}[:, j_i], r̂_i⟩/C with r̂_i = (p_i − e_{y_i})_R/‖·‖: 1 + σZ when
included, σZ when not.

Text canaries (random-token texts through the tiny model) found nothing: their last hidden states are
nearly collinear (g = (p − e_y) hᵀ with d = 64), so 256 of them drowned each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from privlm.audit.outcome import CanaryOutcome, inclusion_bits
from privlm.audit.scale import Scale
from privlm.errors import UserError
from privlm.privacy.calibration import gaussian_releases_epsilon
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm.prompt import build_prompt, head_logits
from privlm.synthesis.gradmm.release import PrivateFactors, draw_release, per_sample_factors, released_rows

LABEL_WORDS = ("bad", "great")
ALIGN = 8  # the tiny Llama's hidden width: 4 attention heads of even width (RoPE)


@dataclass(frozen=True)
class GradmmCanaries:
    """m crafted-factor canaries of hidden-state norm ``norm``·C (≥ 1: clipped); ``release``: which
    LM-head rows are released (``label-rows`` or ``full``, as ``privlm synth --release``)."""

    canaries: int = 1000
    norm: float = 10.0
    release: str = "label-rows"

    def hidden_size(self) -> int:
        """⌈m/K⌉ rounded up to a multiple of 8 (what the tiny Llama accepts): a coordinate per canary of a class."""
        return ALIGN * math.ceil(self.canaries / (len(LABEL_WORDS) * ALIGN))

    def run(self, epsilon: float, delta: float, clip: float = 1.0, seed: int = 0) -> CanaryOutcome:
        """Draw one release from the included canaries and score every canary (module docstring)."""
        if self.canaries < 2 or not self.norm >= 1.0:
            raise UserError(f"need >= 2 canaries of norm >= C, got {self.canaries} of norm {self.norm}·C")
        included = torch.from_numpy(inclusion_bits(self.canaries, seed))
        width = self.hidden_size()
        model, tokenizer = build_tiny_model("tiny-llama", seed=seed, hidden_size=width)
        prompt = build_prompt(tokenizer, " It was ", LABEL_WORDS)
        index = torch.arange(self.canaries)
        labels, coords = index % len(LABEL_WORDS), index // len(LABEL_WORDS)
        hidden = torch.zeros(self.canaries, width)
        hidden[index, coords] = self.norm * clip
        rows = released_rows(prompt, self.release)
        factors = (
            PrivateFactors(hidden[included], labels[included]) if included.any() else None
        )  # no canary in: the library's noise-only release (reads no data)
        release = draw_release(model, prompt, factors, epsilon=epsilon, delta=delta, clip=clip, rows=rows, max_tokens=8)
        with torch.no_grad():
            probs = torch.softmax(head_logits(model, hidden).double(), dim=-1)
        resid, norms = per_sample_factors(hidden.double(), probs, torch.tensor(prompt.label_token_ids)[labels], rows)
        direction = resid / resid.norm(dim=1, keepdim=True)
        columns = release.targets.double()[labels, :, coords]  # m × |R|: canary i's class sum at its coordinate
        scores = (columns * direction).sum(1) / clip
        return CanaryOutcome(
            scores=scores.numpy(),
            included=included.numpy(),
            accounted_epsilon=gaussian_releases_epsilon(release.noise_multiplier, 1, delta, release.snapped),
            delta=delta,
            details={
                "noise_multiplier": release.noise_multiplier,
                "hidden_size": width,
                "release": self.release,
                "canary_norm": self.norm,
                "smallest_gradient_norm": float(norms.min()) / clip,
            },
        )


def run_cell(mode: str, epsilon: float, scale: Scale, delta: float, seed: int) -> CanaryOutcome:
    """Audit entry point ``gradmm``: one release of the ``mode`` rows (``label-rows`` or ``full``) at ε."""
    return GradmmCanaries(canaries=scale.gradmm_canaries, release=mode).run(epsilon, delta, seed=seed)
