"""The training loop: the budget stop against dp-accounting, the non-private path against a plain
AdamW loop, and ε/ledger bookkeeping."""

from __future__ import annotations

import math

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from privlm.dpsgd.losses import causal_lm_losses
from privlm.privacy import Ledger, PoissonGaussianStep
from privlm.resources.tiny import build_tiny_model
from privlm.training.data import TaskData, encode, make_collate
from privlm.training.loop import TrainConfig, prepare, steps_within_budget, train_loop

TEXTS = tuple(f"text {i}: " + "the film was great " * (1 + i % 3) for i in range(12))


def _reference_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


def test_steps_within_budget_is_the_last_step_under_the_target():
    q, sigma, delta, target = 0.05, 1.1, 1e-5, 1.5
    n = steps_within_budget(PoissonGaussianStep(q, sigma), target, delta, upper=500)
    assert 0 < n < 500
    assert _reference_epsilon(q, sigma, n, delta) <= target < _reference_epsilon(q, sigma, n + 1, delta) * 1.001


def _setup(config: TrainConfig):
    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    model.train()
    rows = encode(TaskData("lm", TEXTS, (), None), tokenizer, max_length=16)
    return model, rows, prepare(model, rows, make_collate(tokenizer), config)


def test_loop_stops_cleanly_when_the_budget_is_spent(tmp_path):
    # the default DP loss release (α = 0.2) is accounted with the gradient: σ_eff = σ/√(1+α²)
    sigma_eff = 3.0 / math.sqrt(1 + 0.2**2)
    target = _reference_epsilon(0.5, sigma_eff, 5, 1e-5) * 1.001  # enough for 5 steps, not for 6
    config = TrainConfig(
        task="lm",
        epsilon=target,
        noise_multiplier=3.0,
        batch_size=6,
        epochs=10,
        seed=0,
        checkpoint_every=4,
        log_every=1000,
    )
    _, _, run = _setup(config)
    assert run.noise_multiplier == 3.0 and run.accounted_noise_multiplier == pytest.approx(sigma_eff, rel=1e-12)
    result = train_loop(run, tmp_path / "run")
    assert result.stopped == "budget" and result.steps == 5 and run.total_steps == 20
    assert result.epsilon <= target < _reference_epsilon(0.5, sigma_eff, 6, 1e-5)
    ledger = Ledger.load(tmp_path / "run" / "privacy.json")
    assert sum(e.count for e in ledger) == result.steps
    assert ledger.epsilon(1e-5) == pytest.approx(result.epsilon, rel=1e-9)


def test_non_private_path_is_plain_adamw_on_the_mean_loss():
    config = TrainConfig(task="lm", private=False, batch_size=100, epochs=3, lr=1e-2, seed=0, log_every=1000)
    model, rows, run = _setup(config)  # q = 1: every step sees every example
    result = train_loop(run)
    assert result.epsilon is None and result.steps == 3

    reference, tokenizer = build_tiny_model("tiny-llama", seed=0)
    reference.train()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    batch = make_collate(tokenizer)(rows)
    for _ in range(3):
        optimizer.zero_grad()
        causal_lm_losses(reference, batch, reduction="mean").mean().backward()
        optimizer.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-5, msg=name)
