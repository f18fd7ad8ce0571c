"""White-box gradient canaries for DP-SGD (as in the white-box audits of Steinke, Nasr, Jagielski 2023).

Canary i is an example whose per-sample gradient is ``norm·C·e_{r_i} e_{c_i}ᵀ`` on the weight of a
dedicated audit layer (``AuditModel.canary``, zero-initialised, used only by canaries): a fixed
coordinate direction, distinct for every canary, of norm ``canary_norm``·C ≥ C. It is an ordinary
row of the data set: Poisson-sampled like every example, clipped by the engine in the run's norm mode
(its estimated norm in ``hutchinson`` is ``norm·C·√(χ²_k/k)``: a rank-one gradient, the spectrum where
the estimator's variance is largest and the accountant's envelope is attained), summed, noised, and
accounted. Alongside, ``real_examples`` random-token texts train the tiny LM through the same engine,
so the canaries share micro-batches, probes and noise with ordinary rows. An excluded canary's slot
holds a null row (zero gradient, zero loss): the data set size N, hence the sampling rate q and the
normalisation qN — public parameters in privlm's accounting — do not depend on which canaries are in,
and removing a canary is exactly the add/remove neighbour the accountant covers. The canary layer is a near-
square grid (one cell per canary); probes act on its rows, so the √m canaries of one row share their
estimated-norm ratio X in a step (their contributions are then correlated, not independent).

The score of canary i is the projection of the final update sum onto its direction,
``(W_0 − W_T)[r_i, c_i]·qN`` (SGD with learning rate 1: the sum of the noisy clipped sums, in units of
the gradient), which an auditor reads off the final model alone.

With a :class:`~privlm.dpsgd.loss_release.LossRelease`, every canary's loss is pinned at the loss bound
L (a constant added to its loss), so each canary moves both the gradient and the released loss by the
most they can move; the run is then accounted at σ/√(1+α²).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from privlm.audit.outcome import CanaryOutcome, inclusion_bits
from privlm.audit.scale import Scale
from privlm.audit.training import RunSettings, cell_settings, null_mask, train_private
from privlm.dpsgd.loss_release import LossRelease
from privlm.dpsgd.losses import causal_lm_losses
from privlm.errors import UserError
from privlm.resources.tiny import build_tiny_model


class AuditModel(nn.Module):
    """A tiny LM (or none) plus the canary layer ``canary`` (rows × cols, no bias, zero weights)."""

    def __init__(self, lm: nn.Module | None, rows: int, cols: int) -> None:
        super().__init__()
        self.lm = lm
        self.canary = nn.Linear(cols, rows, bias=False)
        nn.init.zeros_(self.canary.weight)


def audit_losses(model: AuditModel, batch: dict[str, Tensor]) -> Tensor:
    """Per-sample losses: the LM's mean token loss for ordinary rows, ``bᵀ W a + offset`` for canaries
    (gradient b aᵀ on the canary layer; ordinary rows have a = b = 0)."""
    losses = (batch["canary_out"] * model.canary(batch["canary_in"])).sum(-1) + batch["loss_offset"]
    if model.lm is None:
        return losses
    text = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    return losses + causal_lm_losses(model.lm, text, reduction="mean") * (1.0 - batch["is_canary"])


@dataclass(frozen=True)
class GradientCanaries:
    """A white-box gradient-canary audit of DP-SGD: how many canaries, their norm (units of C), how
    many ordinary LM rows train alongside (0: no LM), and their length in tokens."""

    canaries: int = 1000
    canary_norm: float = 2.0
    real_examples: int = 64
    seq_len: int = 8

    def grid(self) -> tuple[int, int]:
        """(rows, cols) of the canary layer: the smallest near-square grid with one cell per canary."""
        cols = math.isqrt(self.canaries - 1) + 1
        return math.ceil(self.canaries / cols), cols

    def examples(self, included: np.ndarray, settings: RunSettings, vocab: int, seed: int) -> list[dict[str, Tensor]]:
        """The data set: canary slot i holds canary i if it is included, else a null row (zero gradient,
        zero loss), then the ordinary random-token rows."""
        rows, cols = self.grid()
        scale = self.canary_norm * settings.max_grad_norm
        release = settings.loss_release()
        offset = 0.0 if release is None else release.bound
        gen = torch.Generator().manual_seed(seed)
        blank = torch.zeros(self.seq_len, dtype=torch.long)
        first = null_mask(self.seq_len)  # canaries' LM input: one token (masked out of the loss)
        out = []
        for i, inside in enumerate(included):
            a, b = torch.zeros(cols), torch.zeros(rows)
            if inside:
                a[i % cols], b[i // cols] = 1.0, scale
            out.append(
                {
                    "input_ids": blank,
                    "attention_mask": first,
                    "canary_in": a,
                    "canary_out": b,
                    "is_canary": torch.tensor(1.0),
                    "loss_offset": torch.tensor(offset if inside else 0.0),
                }
            )
        for _ in range(self.real_examples):
            out.append(
                {
                    "input_ids": torch.randint(1, vocab, (self.seq_len,), generator=gen),
                    "attention_mask": torch.ones(self.seq_len, dtype=torch.long),
                    "canary_in": torch.zeros(cols),
                    "canary_out": torch.zeros(rows),
                    "is_canary": torch.tensor(0.0),
                    "loss_offset": torch.tensor(0.0),
                }
            )
        return out

    def run(self, settings: RunSettings) -> CanaryOutcome:
        """Insert, train once, score every canary (module docstring)."""
        if self.canaries < 2 or not self.canary_norm >= 1.0:
            raise UserError(f"need >= 2 canaries of norm >= C, got {self.canaries} of norm {self.canary_norm}·C")
        included = inclusion_bits(self.canaries, settings.seed)
        lm = None
        vocab = 2
        if self.real_examples:
            lm, tokenizer = build_tiny_model("tiny-llama", seed=settings.seed)
            vocab = len(tokenizer)
        rows, cols = self.grid()
        model = AuditModel(lm, rows, cols)
        examples = self.examples(included, settings, vocab, settings.seed)
        run = train_private(model, examples, audit_losses, settings)
        moved = -model.canary.weight.detach().double().flatten()[: self.canaries]
        expected_batch = run.sample_rate * len(examples)
        return CanaryOutcome(
            scores=(moved * expected_batch).numpy(),
            included=included,
            accounted_epsilon=run.accounted_epsilon,
            delta=settings.delta,
            details={
                "noise_multiplier": run.noise_multiplier,
                "sample_rate": run.sample_rate,
                "steps": run.steps,
                "canary_norm": self.canary_norm,
                "real_examples": self.real_examples,
            },
        )


def _canaries(scale: Scale) -> GradientCanaries:
    return GradientCanaries(canaries=scale.canaries, canary_norm=scale.canary_norm, real_examples=scale.real_examples)


def run_whitebox(mode: str, epsilon: float, scale: Scale, delta: float, seed: int) -> CanaryOutcome:
    """Audit entry point ``dpsgd-whitebox``: DP-SGD in norm ``mode`` at target ε with gradient canaries."""
    return _canaries(scale).run(cell_settings(mode, epsilon, scale, delta, seed))


def run_dp_loss(mode: str, epsilon: float, scale: Scale, delta: float, seed: int) -> CanaryOutcome:
    """Audit entry point ``dp-loss``: as :func:`run_whitebox`, with the DP training-loss release in the budget."""
    return _canaries(scale).run(cell_settings(mode, epsilon, scale, delta, seed, LossRelease()))
