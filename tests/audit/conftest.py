"""Deliberately broken mechanisms, for the audit to catch. They live here, in test code only: each
fixture patches one defect into the library *for the duration of one test* (pytest's monkeypatch
undoes it), while the engine keeps accounting the unbroken mechanism — the claim the audit checks.
Also seeded OS noise keys, for deterministic audits of the mechanisms that draw their own."""

from __future__ import annotations

import pytest
import torch

import privlm.dpsgd.clipping
import privlm.dpsgd.engine
import privlm.dpsgd.settings
import privlm.synthesis.pe.mechanism as pe
from privlm.dpsgd.clipping import PerSampleClipper
from privlm.dpsgd.engine import PrivacyEngine


class _HalfNoiseEngine(PrivacyEngine):
    """Accounts σ but draws σ/2."""

    def make_private(self, *args, **kwargs):
        model, optimizer, loader = super().make_private(*args, **kwargs)
        optimizer.noise_multiplier *= 0.5
        return model, optimizer, loader


class _PerMicroBatchProbes(PerSampleClipper):
    """The pre-fix behaviour: every physical micro-batch draws its own probes (address: step,
    parameter, micro-batch counter), so an example's clip factor depends on where the cut falls."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._micro_batch = 0

    def clipped_backward(self, batch):
        self._micro_batch += 1
        return super().clipped_backward(batch)

    def probe_matrix(self, param, columns, dtype, device):
        address = (self.step, self._index[param], self._micro_batch)
        return self.randomness.normal((param.shape[0], columns), address, dtype=dtype, device=device)


@pytest.fixture
def halved_noise(monkeypatch):
    monkeypatch.setattr(privlm.dpsgd.settings, "PrivacyEngine", _HalfNoiseEngine)


@pytest.fixture
def skipped_clipping(monkeypatch):
    monkeypatch.setattr(privlm.dpsgd.clipping, "clip_factors", lambda sq_norms, c: torch.ones_like(sq_norms))


@pytest.fixture
def per_micro_batch_probes(monkeypatch):
    monkeypatch.setattr(privlm.dpsgd.engine, "PerSampleClipper", _PerMicroBatchProbes)


@pytest.fixture
def pe_halved_noise(monkeypatch):
    """PE draws σ/2 per bin while its ledger still records σ."""
    real = pe.noisy_histograms
    monkeypatch.setattr(pe, "noisy_histograms", lambda counts, sigma: real(counts, sigma / 2))


@pytest.fixture
def pe_double_votes(monkeypatch):
    """Every private example votes twice (sensitivity 2) while σ is calibrated for one vote."""
    real = pe.vote_counts
    monkeypatch.setattr(pe, "vote_counts", lambda *args: [2 * c for c in real(*args)])
