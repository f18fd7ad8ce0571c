"""PrivacyEngine end to end on tiny Llama: Poisson loader, micro-batches, one accounted event per
logical step with the norm mode's clipping kind, ε checked against dp-accounting directly."""

from __future__ import annotations

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dpsgd_harness import padded_batch, reference_clipped_sum, reference_grads, tiny_model
from torch.utils.data import DataLoader

from privlm.dpsgd.engine import PrivacyEngine
from privlm.dpsgd.sampling import physical_batches, take_rows
from privlm.errors import UserError


def _rows(n: int = 8) -> list[dict]:
    batch = padded_batch([12, 5, 9, 7, 12, 3, 10, 8][:n], seq_len=12, seed=4)
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def _train(norm_mode: str, probes: int = 8, sigma: float = 1.0):
    model = tiny_model("tiny-llama", lora=True)
    rows = _rows()
    engine = PrivacyEngine(norm_mode=norm_mode, probes=probes, seed=0)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    model, optimizer, loader = engine.make_private(
        model,
        optimizer,
        DataLoader(rows, batch_size=4),
        noise_multiplier=sigma,
        max_grad_norm=1.0,
        max_physical_batch_size=2,
    )
    sizes = []
    for batch in loader:
        optimizer.zero_grad()
        stats = model.clipped_backward(batch)
        sizes.append(len(stats.losses))
        optimizer.step()
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    return engine, sizes, before, after


def _dp_accounting_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


def test_training_steps_are_accounted_with_randomized_clipping():
    engine, sizes, before, after = _train("hutchinson", probes=8)
    assert engine.steps == len(sizes) == 2  # ⌈1/q⌉ with q = 4/8
    ((event, count),) = engine.accountant.events
    assert (event.sample_rate, event.noise_multiplier, event.clipping, event.probes, count) == (
        0.5,
        1.0,
        "hutchinson",
        8,
        2,
    )
    assert all(torch.isfinite(a).all() for a in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    exact = _dp_accounting_epsilon(0.5, 1.0, 2, 1e-5)
    assert engine.epsilon(1e-5) > exact  # randomized clipping costs more than exact clipping


def test_exact_modes_give_the_standard_epsilon():
    engine, _, _, _ = _train("ghost")
    ((event, _),) = engine.accountant.events
    assert event.clipping == "exact"
    reference = _dp_accounting_epsilon(0.5, 1.0, 2, 1e-5)
    assert reference * (1 - 1e-6) <= engine.epsilon(1e-5) <= reference * (1 + 1e-2)  # never below the reference


def test_bad_arguments_are_user_errors():
    with pytest.raises(UserError, match="norm_mode"):
        PrivacyEngine(norm_mode="fast")
    with pytest.raises(UserError, match="probes"):
        PrivacyEngine(norm_mode="hutchpp", probes=2)
    engine = PrivacyEngine()
    model = tiny_model("tiny-llama", lora=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UserError, match="exactly one"):
        engine.make_private(model, opt, DataLoader(_rows(), batch_size=4), max_grad_norm=1.0)


def test_target_epsilon_is_met_after_the_planned_epochs():
    model = tiny_model("tiny-llama", lora=True)
    engine = PrivacyEngine(norm_mode="ghost", seed=1)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    model, opt, loader = engine.make_private(
        model, opt, DataLoader(_rows(), batch_size=4), target_epsilon=3.0, delta=1e-5, epochs=2, max_grad_norm=1.0
    )
    for _ in range(2):
        for batch in loader:
            opt.zero_grad()
            model.clipped_backward(batch)
            opt.step()
    assert engine.steps == 4
    assert 0.95 * 3.0 <= engine.epsilon(1e-5) <= 3.0


def test_a_micro_batch_cut_that_loses_or_repeats_rows_is_refused():
    """A cut must hold every row once (the clipped sum's sensitivity rests on it); the row count is checked."""

    def repeats_the_first_row(batch, size):
        yield from physical_batches(batch, size)
        yield take_rows(batch, 0, 1)

    def drops_the_last_row(batch, size):
        yield from physical_batches(take_rows(batch, 0, len(batch["input_ids"]) - 1), size)

    for cut in (repeats_the_first_row, drops_the_last_row):
        model = tiny_model("tiny-llama", lora=True)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
        private, optimizer, loader = PrivacyEngine(seed=0).make_private(
            model,
            optimizer,
            DataLoader(_rows(), batch_size=8),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            micro_batches=cut,
        )
        optimizer.zero_grad()
        with pytest.raises(ValueError, match="every row of the logical batch exactly once"):
            private.clipped_backward(padded_batch([12, 5, 9], seq_len=12, seed=4))


def test_no_noise_clips_exactly_and_is_not_private():
    """σ = 0 (the clipping-only ablation): the update is the clipped sum of a micro-batch-of-one autograd
    loop divided by the expected batch size, nothing is accounted, and ε is ∞ — never a finite number."""
    model = tiny_model("tiny-llama", lora=True)
    batch = padded_batch([12, 5, 9, 7], seq_len=12, seed=4)
    clip = 0.05  # below every per-sample norm here: every example is clipped
    expected = [g / 2.0 for g in reference_clipped_sum(reference_grads(model, batch), clip)]  # B = 8 · q 1/4
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    engine = PrivacyEngine(norm_mode="mixed", seed=0)
    private, optimizer, _ = engine.make_private(
        model, optimizer, DataLoader(_rows(), batch_size=2), noise_multiplier=0.0, max_grad_norm=clip
    )
    optimizer.zero_grad()
    private.clipped_backward(batch)
    optimizer.privatize_grads()
    got = [p.grad for p in model.parameters() if p.requires_grad]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-7)
    assert engine.event is None and engine.epsilon(1e-5) == float("inf")
    optimizer.step()
    assert engine.accountant.epsilon(1e-5) == 0.0  # nothing was recorded
