"""Noise once per logical step (not per micro-batch), N(0, σ²C²) scaled by 1/(q·N), noise-free update
equals the reference clipped sum / expected batch size."""

from __future__ import annotations

import torch
from dpsgd_harness import padded_batch, reference_clipped_sum, reference_grads, tiny_model
from torch import nn

from privlm.dpsgd.clipping import PerSampleClipper
from privlm.dpsgd.engine import PrivateModel
from privlm.dpsgd.losses import causal_lm_losses
from privlm.dpsgd.optimizer import DPOptimizer
from privlm.randomness import SecureRandom


def _private(model, c, sigma, ebs, seed, physical=None):
    clipper = PerSampleClipper(model, causal_lm_losses, max_grad_norm=c, norm_mode="ghost")
    opt = DPOptimizer(
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0),
        clipper,
        noise_multiplier=sigma,
        expected_batch_size=ebs,
        randomness=SecureRandom.from_seed(seed, "noise"),
    )
    return PrivateModel(model, clipper, physical), opt


def test_noise_free_update_is_reference_clipped_sum_over_expected_batch_size():
    model = tiny_model("tiny-llama")
    batch = padded_batch([12, 6, 9], seq_len=12, seed=2)
    c = 2.0
    expected = reference_clipped_sum(reference_grads(model, batch), c)
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    private, opt = _private(model, c, 0.0, 2.5, 0)
    opt.zero_grad()
    private.clipped_backward(batch)
    opt.step()
    private.clipper.capture.remove()
    for b, p, e in zip(before, params, expected):
        torch.testing.assert_close(b - p.detach(), e / 2.5, rtol=1e-6, atol=1e-6 * float(e.abs().max()))


def test_noise_added_once_per_logical_step_across_micro_batches():
    batch = padded_batch([12, 6, 9, 4], seq_len=12, seed=3)
    grads = []
    for physical in (None, 1):
        model = tiny_model("tiny-gpt2")
        private, opt = _private(model, 1.0, 0.7, 4.0, seed=11, physical=physical)
        opt.zero_grad()
        private.clipped_backward(batch)
        opt.privatize_grads()
        grads.append([p.grad.clone() for p in model.parameters() if p.requires_grad])
        private.clipper.capture.remove()
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)


def test_noise_on_an_empty_step_is_gaussian_sigma_c_over_expected_batch_size():
    model = nn.Sequential(nn.Linear(100, 100)).double()
    sigma, c, ebs = 1.3, 0.4, 8.0
    clipper = PerSampleClipper(model, lambda m, b: m(b).sum(1), max_grad_norm=c)
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        clipper,
        noise_multiplier=sigma,
        expected_batch_size=ebs,
        randomness=SecureRandom.from_seed(0, "noise"),
    )
    opt.zero_grad()
    opt.privatize_grads()
    z = torch.cat([p.grad.flatten() for p in model.parameters()]) * ebs / (sigma * c)
    n = z.numel()
    assert abs(float(z.mean())) <= 4 / n**0.5
    assert abs(float(z.var()) - 1) <= 4 * (2 / n) ** 0.5


def test_stray_unclipped_gradients_are_discarded():
    model = nn.Sequential(nn.Linear(3, 2)).double()
    clipper = PerSampleClipper(model, lambda m, b: m(b).sum(1), max_grad_norm=1.0)
    opt = DPOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        clipper,
        noise_multiplier=0.0,
        expected_batch_size=1.0,
        randomness=SecureRandom.from_seed(1, "noise"),
    )
    opt.zero_grad()
    (1e6 * model(torch.ones(2, 3, dtype=torch.float64)).sum()).backward()
    opt.privatize_grads()
    assert all(float(p.grad.abs().max()) == 0 for p in model.parameters())
