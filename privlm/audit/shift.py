"""Micro-batch shift canaries: does an example's clip factor depend on where the micro-batch cut falls?

privlm draws one probe matrix per parameter per logical step (:mod:`privlm.dpsgd.clipping`), so a
clip factor is a function of the example and the step's probes only, and adding an example changes one
term of the clipped sum. Drawn per physical micro-batch instead (the pre-fix code), an added example
shifts every later row by one position, moves the micro-batch cut, and changes the clip factors of
*other* examples. These canaries measure exactly that, and nothing else.

Design (one full-batch step, q = 1, physical micro-batches of 2 rows cut by position, no LM; the audit
layer of :class:`~privlm.audit.gradient.AuditModel` with ``columns`` rows and one column per canary):
canary i is a **zero-gradient** example; its slot is followed by block i, ``columns`` runs of
2·``run_length`` rows each, row j of run c having the per-sample gradient s·(±e_c e_iᵀ) with signs
+ − − + + − − + … and s = ``scale``·C ≫ C (every row is clipped, to C/√X for Hutchinson's estimate
n̂²/n² = X ~ χ²_k/k of a rank-one gradient). Block i starts at an even position iff an even number of
canaries 0…i is included:

* even ("together"): the micro-batches of block i are the pairs (+, −), (−, +), …; with probes drawn per
  micro-batch both rows of a pair still share them, hence their clip factor, and cancel exactly;
* odd ("split"): every micro-batch holds two rows of one sign, (−, −), (+, +), …; run c of block i then
  receives Σ ±2C·X_m^{-1/2} over its micro-batches: mean 0, variance V = (4L − 2)·Var(X^{-1/2})·C²
  (L = ``run_length``; Var = 0.106 at k = 8), far above the noise σ²C² once L is large.

With privlm's per-step probes every pair cancels in both cases: the released column of a block is
noise alone and the canaries are invisible (the same audit then gives a bound near 0). The shift moves
the *variance* of the release, not its mean (each clip factor's law is the same in every micro-batch),
so the score is a χ²-type likelihood ratio: block i's energy E_i = ‖y_i‖² (y_i its released column, in
units of C) gives the log-odds λ_i = E_i (1/σ² − 1/(σ² + V))/2 − (d/2) ln(1 + V/σ²) of "split" against
"together" (each coordinate Gaussian, N(0, σ² + V) against N(0, σ²)), and canary i is included iff the
parity flips between blocks i − 1 and i: its score is the log-odds of that flip,
logaddexp(λ_{i−1}, λ_i) − logaddexp(0, λ_{i−1} + λ_i) (λ_{−1} = −∞: nothing precedes canary 0).
Any score is valid for the bound; this one assumes Hutchinson's rank-one law with the run's k.

Nothing here breaks anything: the pre-fix clipper exists only as a test fixture
(``tests/audit/conftest.py``), which patches it into the engine for one test. An excluded canary's row
is absent (the added/removed example is the zero-gradient row itself), so N varies with the inclusion
bits; at q = 1 nothing public depends on N (σ is calibrated for q = 1 and one step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import gammaln
from torch import Tensor

from privlm.audit.gradient import AuditModel, audit_losses
from privlm.audit.outcome import CanaryOutcome, inclusion_bits
from privlm.audit.training import RunSettings, train_private
from privlm.errors import UserError


def inverse_root_variance(k: int) -> float:
    """Var(X^{-1/2}) for X ~ χ²_k/k (k ≥ 3): k/(k − 2) − (√(k/2)·Γ((k−1)/2)/Γ(k/2))²."""
    if k < 3:
        raise UserError(f"Var(X^-1/2) is infinite for k < 3 probes, got k = {k}")
    mean = math.sqrt(k / 2) * math.exp(gammaln((k - 1) / 2) - gammaln(k / 2))
    return k / (k - 2) - mean**2


@dataclass(frozen=True)
class ShiftCanaries:
    """``canaries`` zero-gradient canaries, each followed by ``columns`` runs of 2·``run_length`` rows of
    gradient ±``scale``·C·e_c e_iᵀ (module docstring)."""

    canaries: int = 128
    columns: int = 8
    run_length: int = 120
    scale: float = 100.0

    def examples(self, included: np.ndarray, max_grad_norm: float) -> list[dict[str, Tensor]]:
        """Canary i's row (zero gradient) if it is included, then block i."""
        d, m = self.columns, self.canaries
        pattern = [1.0, -1.0, -1.0, 1.0] * ((2 * self.run_length + 3) // 4)
        signs = pattern[: 2 * self.run_length]
        zero_in, zero_out = torch.zeros(m), torch.zeros(d)
        base = {
            "input_ids": torch.zeros(2, dtype=torch.long),
            "attention_mask": torch.ones(2, dtype=torch.long),
            "is_canary": torch.tensor(1.0),
            "loss_offset": torch.tensor(0.0),
        }
        outs = {
            (c, sign): torch.zeros(d).index_fill_(0, torch.tensor([c]), sign * self.scale * max_grad_norm)
            for c in range(d)
            for sign in (1.0, -1.0)
        }
        out = []
        for i, inside in enumerate(included):
            if inside:
                out.append({**base, "canary_in": zero_in, "canary_out": zero_out})
            column = torch.zeros(m).index_fill_(0, torch.tensor([i]), 1.0)
            out.extend({**base, "canary_in": column, "canary_out": outs[(c, sign)]} for c in range(d) for sign in signs)
        return out

    def split_variance(self, probes: int) -> float:
        """V/C²: the variance a split run leaves on its coordinate under Hutchinson with ``probes``."""
        return (4 * self.run_length - 2) * inverse_root_variance(probes)

    def scores(self, released: np.ndarray, noise_multiplier: float, probes: int) -> np.ndarray:
        """Log-odds that each canary is included, from the released columns (d × m, units of C)."""
        s2, v = noise_multiplier**2, self.split_variance(probes)
        energy = (released**2).sum(0)
        split = energy * (1 / s2 - 1 / (s2 + v)) / 2 - self.columns / 2 * math.log1p(v / s2)
        before = np.concatenate([[-np.inf], split[:-1]])
        return np.logaddexp(before, split) - np.logaddexp(0.0, before + split)

    def run(self, settings: RunSettings) -> CanaryOutcome:
        """Insert, run one full-batch step with micro-batches of 2, score every canary."""
        if self.canaries < 2 or self.columns < 1 or self.run_length < 1 or not self.scale >= 1.0:
            raise UserError(f"need >= 2 canaries, >= 1 column and run, scale >= 1; got {self}")
        if settings.sample_rate != 1.0 or settings.steps != 1 or settings.physical_batch_size != 2:
            raise UserError("shift canaries need one full-batch step (sample rate 1, 1 step) and micro-batches of 2")
        included = inclusion_bits(self.canaries, settings.seed)
        model = AuditModel(None, self.columns, self.canaries)
        examples = self.examples(included, settings.max_grad_norm)
        run = train_private(model, examples, audit_losses, settings)
        released = -model.canary.weight.detach().double() * len(examples) / settings.max_grad_norm  # lr 1, qN = N
        return CanaryOutcome(
            scores=self.scores(released.numpy(), run.noise_multiplier, settings.probes),
            included=included,
            accounted_epsilon=run.accounted_epsilon,
            delta=settings.delta,
            details={
                "noise_multiplier": run.noise_multiplier,
                "rows": len(examples),
                "columns": self.columns,
                "run_length": self.run_length,
                "probes": settings.probes,
            },
        )
