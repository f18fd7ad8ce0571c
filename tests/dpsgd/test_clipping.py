"""Noise-free clipped sums equal the reference clipped sum; book-keeping equals the second backward."""

from __future__ import annotations

import pytest
import torch
from dpsgd_harness import padded_batch, reference_clipped_sum, reference_grads, reference_sq_norms, tiny_model

from privlm.dpsgd.clipping import PerSampleClipper, clip_factors
from privlm.dpsgd.losses import causal_lm_losses
from privlm.errors import UserError
from privlm.resources.tiny import build_tiny_model


@pytest.fixture(scope="module")
def cases():
    out = {}
    for name, lora in (("tiny-llama", False), ("tiny-gpt2", False), ("tiny-llama", True)):
        model = tiny_model(name, lora=lora)
        batch = padded_batch([12, 9, 4, 11], seq_len=12, seed=5)
        grads = reference_grads(model, batch)
        c = float(reference_sq_norms(grads).sqrt().median())  # some samples clipped, some not
        out[name, lora] = (model, batch, c, reference_clipped_sum(grads, c))
    return out


def _clipped(model, batch, c, **kwargs):
    clipper = PerSampleClipper(model, causal_lm_losses, max_grad_norm=c, **kwargs)
    try:
        stats = clipper.clipped_backward(batch)
        return stats, [g for g in clipper.pop_summed_grads().values()]
    finally:
        clipper.capture.remove()


def _assert_close_all(got, expected, rtol):
    """Relative Frobenius error per parameter. (Element-wise rtol is too strict for tiny elements:
    Hugging Face's LlamaRMSNorm casts to float32, so backprops through it carry float32 rounding.)"""
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert float((g - e).norm()) <= rtol * float(e.norm()) + 1e-15, (float((g - e).norm()), float(e.norm()))


def test_clip_factors():
    got = clip_factors(torch.tensor([0.0, 1.0, 4.0, 16.0], dtype=torch.float64), 2.0)
    torch.testing.assert_close(got, torch.tensor([1.0, 1.0, 1.0, 0.5], dtype=torch.float64))


@pytest.mark.parametrize("bookkeeping", [True, False])
@pytest.mark.parametrize("mode", ["exact", "ghost", "mixed"])
@pytest.mark.parametrize("case", [("tiny-llama", False), ("tiny-gpt2", False), ("tiny-llama", True)])
def test_clipped_sum_matches_reference(cases, case, mode, bookkeeping):
    model, batch, c, expected = cases[case]
    stats, got = _clipped(model, batch, c, norm_mode=mode, bookkeeping=bookkeeping)
    assert (stats.factors < 1).any() and (stats.factors == 1).any()
    _assert_close_all(got, expected, 1e-6)


@pytest.mark.parametrize("mode", ["hutchinson", "hutchpp"])
def test_bookkeeping_equals_second_backward_in_randomized_modes(cases, mode):
    model, batch, c, _ = cases["tiny-gpt2", False]
    results = [
        _clipped(model, batch, c, norm_mode=mode, probes=6, bookkeeping=bk, generator=torch.Generator().manual_seed(7))
        for bk in (True, False)
    ]
    torch.testing.assert_close(results[0][0].factors, results[1][0].factors, rtol=0, atol=0)
    _assert_close_all(results[0][1], results[1][1], 1e-6)


def test_clipped_norm_never_exceeds_c_in_exact_modes(cases):
    model, batch, c, _ = cases["tiny-llama", False]
    one_by_one = reference_grads(model, batch)
    norms = reference_sq_norms(one_by_one).sqrt()
    stats, _ = _clipped(model, batch, c, norm_mode="ghost")
    assert (stats.factors * norms <= c * (1 + 1e-9)).all()


class _FunctionalReuse(torch.nn.Module):
    """A Linear whose weight is also used outside the layer's own call (the second backward's blind spot)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.nn.functional.linear(2 * x, self.lin.weight)


def _squared_outputs(model, x):
    return model(x).pow(2).sum(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_second_backward_check_accepts_half_precision_models(name, dtype):
    """Rounding of bf16/fp16 gradients (tied embeddings, RMSNorm, GPT-2 positions) is not a functional use."""
    model, _ = build_tiny_model(name, seed=0, dtype=dtype)
    clipper = PerSampleClipper(model, causal_lm_losses, max_grad_norm=1.0, norm_mode="exact", bookkeeping=False)
    try:
        clipper.clipped_backward(padded_batch([12, 9, 4, 11], seq_len=12, seed=5))
    finally:
        clipper.capture.remove()
    assert clipper._uses_checked


def test_second_backward_refuses_a_weight_used_outside_its_layer():
    torch.manual_seed(0)
    model, x = _FunctionalReuse(), torch.randn(5, 4, dtype=torch.float64)
    clipper = PerSampleClipper(model, _squared_outputs, max_grad_norm=0.1, bookkeeping=False)
    with pytest.raises(UserError, match=r"lin.weight \(torch.float64\) has a gradient the hooked layer calls do not explain"):
        clipper.clipped_backward(x)
    # Book-keeping releases only the hooked call: every per-sample contribution stays within C.
    clipper = PerSampleClipper(model, _squared_outputs, max_grad_norm=0.1, bookkeeping=True)
    stats = clipper.clipped_backward(x)
    assert (stats.factors < 1).all()
    summed = clipper.pop_summed_grads()
    assert float(torch.cat([g.flatten() for g in summed.values()]).norm()) <= 5 * 0.1 * (1 + 1e-9)
