"""The DP loss release: noise-free it is the clamped mean loss of an independent per-sample loop; its
noise has std σL/(α·qN); the engine accounts each step at σ/√(1+α²) (checked against dp-accounting)
and calibrates that effective multiplier for a target ε."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dpsgd_harness import padded_batch, tiny_model
from torch import nn
from torch.utils.data import DataLoader

from privlm.dpsgd.clipping import PerSampleClipper
from privlm.dpsgd.engine import PrivacyEngine, PrivateModel
from privlm.dpsgd.loss_release import LossRelease
from privlm.dpsgd.losses import IGNORE_INDEX, causal_lm_losses
from privlm.dpsgd.optimizer import DPOptimizer
from privlm.errors import UserError
from privlm.randomness import SecureRandom


def _reference_losses(model: nn.Module, batch: dict) -> list[float]:
    """Per-sample summed token losses, one unpadded sample at a time with PyTorch's cross-entropy."""
    out = []
    with torch.no_grad():
        for i in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][i].sum())
            logits = model(input_ids=batch["input_ids"][i : i + 1, :n]).logits[0, :-1]
            labels = batch["labels"][i, 1:n]
            out.append(float(F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")))
    return out


def _optimizer(
    model: nn.Module, clipper: PerSampleClipper, sigma: float, ebs: float, release: LossRelease, seed: int = 0
):
    return DPOptimizer(
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0),
        clipper,
        noise_multiplier=sigma,
        expected_batch_size=ebs,
        randomness=SecureRandom.from_seed(seed, "noise"),
        loss_release=release,
    )


@pytest.mark.parametrize("physical", [None, 2])
def test_noise_free_release_is_the_clamped_mean_loss(physical):
    model = tiny_model("tiny-llama")
    batch = padded_batch([12, 6, 9, 4, 11], seq_len=12, seed=5)
    losses = _reference_losses(model, batch)
    bound = sorted(losses)[2]  # clamps the two largest losses
    release = LossRelease(bound=bound, fraction=0.3)
    clipper = PerSampleClipper(model, causal_lm_losses, max_grad_norm=1.0, norm_mode="ghost", loss_bound=bound)
    opt = _optimizer(model, clipper, 0.0, 3.5, release)
    opt.zero_grad()
    PrivateModel(model, clipper, physical).clipped_backward(batch)
    opt.step()
    clipper.capture.remove()
    assert opt.released_loss == pytest.approx(sum(min(loss, bound) for loss in losses) / 3.5, rel=1e-9)
    assert sum(loss > bound for loss in losses) == 2


def test_release_noise_has_std_sigma_l_over_alpha_qn():
    model = nn.Linear(2, 1).double()
    sigma, bound, fraction, ebs, n = 1.3, 4.0, 0.25, 6.0, 20_000
    clipper = PerSampleClipper(model, lambda m, b: m(b).sum(1), max_grad_norm=1.0, loss_bound=bound)
    opt = _optimizer(model, clipper, sigma, ebs, LossRelease(bound, fraction))
    draws = []
    for _ in range(n):  # empty logical steps: the released loss is pure noise
        opt.zero_grad()
        opt.step()  # each step draws its own noise (addressed by the step index)
        draws.append(opt.released_loss)
    x = torch.tensor(draws, dtype=torch.float64)
    expected_std = sigma * bound / (fraction * ebs)
    assert abs(float(x.mean())) < 4 * expected_std / n**0.5
    assert float(x.std()) == pytest.approx(expected_std, rel=0.03)  # standard error of the std ≈ 0.5%


def test_without_a_release_nothing_about_losses_is_released():
    model = nn.Linear(2, 1).double()
    clipper = PerSampleClipper(model, lambda m, b: m(b).sum(1), max_grad_norm=1.0)
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.0),
        clipper,
        noise_multiplier=1.0,
        expected_batch_size=1.0,
        randomness=SecureRandom.from_seed(0, "noise"),
    )
    opt.zero_grad()
    PrivateModel(model, clipper, None).clipped_backward(torch.ones(3, 2, dtype=torch.float64))
    opt.step()
    assert opt.released_loss is None and float(clipper.summed_loss) == 0.0


def _rows(n: int = 8) -> list[dict]:
    batch = padded_batch([12, 5, 9, 7, 12, 3, 10, 8][:n], seq_len=12, seed=4)
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def _train(norm_mode: str, release: LossRelease | None, **make_private):
    model = tiny_model("tiny-llama", lora=True)
    engine = PrivacyEngine(norm_mode=norm_mode, probes=8, seed=0)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    model, optimizer, loader = engine.make_private(
        model, optimizer, DataLoader(_rows(), batch_size=4), max_grad_norm=1.0, loss_release=release, **make_private
    )
    released = []
    for _ in range(make_private.get("epochs") or 1):
        for batch in loader:
            optimizer.zero_grad()
            model.clipped_backward(batch)
            optimizer.step()
            released.append(optimizer.released_loss)
    model.clipper.capture.remove()
    return engine, optimizer, released


def _dp_accounting_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("norm_mode", ["ghost", "hutchinson"])
def test_steps_are_accounted_at_the_effective_multiplier(norm_mode):
    sigma, fraction = 1.0, 0.5
    with_release, opt, released = _train(norm_mode, LossRelease(10.0, fraction), noise_multiplier=sigma)
    without, _, nothing = _train(norm_mode, None, noise_multiplier=sigma)
    assert opt.noise_multiplier == sigma and all(math.isfinite(x) for x in released) and nothing == [None, None]
    ((event, count),) = with_release.accountant.events
    assert event.noise_multiplier == pytest.approx(sigma / math.sqrt(1 + fraction**2), rel=1e-12)
    assert (event.clipping, event.probes, count) == (without.event.clipping, without.event.probes, 2)
    assert with_release.epsilon(1e-5) > without.epsilon(1e-5)
    if norm_mode == "ghost":
        reference = _dp_accounting_epsilon(0.5, sigma / math.sqrt(1 + fraction**2), 2, 1e-5)
        assert reference * (1 - 1e-6) <= with_release.epsilon(1e-5) <= reference * (1 + 1e-2)


def test_target_epsilon_calibrates_the_effective_multiplier():
    release = LossRelease(10.0, 0.5)
    engine, opt, _ = _train("ghost", release, target_epsilon=3.0, delta=1e-5, epochs=2)
    plain, plain_opt, _ = _train("ghost", None, target_epsilon=3.0, delta=1e-5, epochs=2)
    assert engine.steps == 4
    assert 0.95 * 3.0 <= engine.epsilon(1e-5) <= 3.0
    assert engine.event.noise_multiplier == pytest.approx(plain.event.noise_multiplier, rel=1e-12)
    assert opt.noise_multiplier == pytest.approx(plain_opt.noise_multiplier * math.sqrt(1.25), rel=1e-12)


@pytest.mark.parametrize("bound, fraction", [(0.0, 0.2), (float("inf"), 0.2), (10.0, 0.0), (10.0, -1.0)])
def test_bad_settings_are_user_errors(bound, fraction):
    with pytest.raises(UserError, match="loss"):
        LossRelease(bound, fraction)


def test_optional_release_is_off_at_fraction_zero_and_refuses_negative_fractions():
    assert LossRelease.optional(10.0, 0.0) is None
    assert LossRelease.optional(10.0, 0.3) == LossRelease(10.0, 0.3)
    with pytest.raises(UserError, match="loss noise fraction"):
        LossRelease.optional(10.0, -0.1)
