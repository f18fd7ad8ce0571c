"""Noise-free clipped sums equal the reference clipped sum; book-keeping equals the second backward."""

from __future__ import annotations

import pytest
import torch
from dpsgd_harness import padded_batch, reference_clipped_sum, reference_grads, reference_sq_norms, tiny_model

from privlm.dpsgd.clipping import PerSampleClipper, clip_factors
from privlm.dpsgd.engine import PrivateModel
from privlm.dpsgd.losses import causal_lm_losses
from privlm.errors import UserError
from privlm.randomness import SecureRandom
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
    clipper.begin_step(1)
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
    nan, inf = float("nan"), float("inf")
    got = clip_factors(torch.tensor([0.0, 1.0, 4.0, 16.0, nan, inf, -inf], dtype=torch.float64), 2.0)
    # a NaN norm is not > C: without its own rule it would pass at factor 1, unclipped
    torch.testing.assert_close(got, torch.tensor([1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("onehot", [False, True])
def test_a_non_finite_sample_adds_exactly_nothing_to_the_clipped_sum(onehot):
    from privlm.dpsgd.norms.factors import DenseFactor, OuterFactor

    g = torch.Generator().manual_seed(0)
    left = (
        torch.randint(0, 4, (3, 2), generator=g) if onehot else torch.randn(3, 2, 4, generator=g, dtype=torch.float64)
    )
    right = torch.randn(3, 2, 5, generator=g, dtype=torch.float64)
    if not onehot:
        left[1, 0, 0] = float("nan")
    right[1, 1, 2] = float("inf")
    factor = OuterFactor(left, right, rows=4)
    per_sample = factor.instantiate()
    c = clip_factors((per_sample**2).sum((1, 2)), 1.0)
    assert c[1] == 0 and bool((c[[0, 2]] > 0).all())
    expected = c[0] * per_sample[0] + c[2] * per_sample[2]
    torch.testing.assert_close(factor.weighted_sum(c, c != 0), expected)
    torch.testing.assert_close(DenseFactor(per_sample).weighted_sum(c, c != 0), expected)
    assert not bool(torch.isfinite(factor.weighted_sum(c)).all())  # without keep, 0 · NaN: why the clipper passes it


@pytest.mark.parametrize("mode", ["exact", "hutchinson"])
def test_a_sample_whose_gradient_is_nan_is_left_out_of_the_clipped_sum(mode):
    """One sample's activations turn NaN (an overflow): book-keeping sums the other samples, clipped, exactly as the
    micro-batch reference does without it; the second backward cannot, and refuses rather than release NaN."""
    model = tiny_model("tiny-llama")
    batch = padded_batch([12, 9, 4, 11], seq_len=12, seed=5)
    others = reference_grads(model, {k: v[[0, 2, 3]] for k, v in batch.items()})
    c = float(reference_sq_norms(others).sqrt().median())
    ghost = PerSampleClipper(model, causal_lm_losses, max_grad_norm=c, norm_mode=mode, probes=8, bookkeeping=False)
    ghost.begin_step(1)
    ghost.clipped_backward(batch)  # a clean first micro-batch passes the hooked-use check
    hook = model.get_input_embeddings().register_forward_hook(
        lambda m, i, out: out.index_fill(0, torch.tensor([1]), float("nan"))
    )
    try:
        with pytest.raises(UserError, match="gradient is not finite"):
            ghost.clipped_backward(batch)
        ghost.capture.remove()
        stats, got = _clipped(model, batch, c, norm_mode=mode, probes=8)
        assert stats.factors[1] == 0 and bool((stats.factors[[0, 2, 3]] > 0).all())
        if mode == "exact":
            _assert_close_all(got, reference_clipped_sum(others, c), 1e-6)
        assert all(bool(torch.isfinite(g).all()) for g in got)
        with pytest.raises(UserError, match="finite per-sample gradient|gradient is not finite"):
            _clipped(model, batch, c, norm_mode=mode, probes=8, bookkeeping=False)
    finally:
        hook.remove()


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
        _clipped(
            model, batch, c, norm_mode=mode, probes=6, bookkeeping=bk, randomness=SecureRandom.from_seed(7, "probes")
        )
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
    with pytest.raises(
        UserError, match=r"lin.weight \(torch.float64\) has a gradient the hooked layer calls do not explain"
    ):
        clipper.clipped_backward(x)
    # Book-keeping releases only the hooked call: every per-sample contribution stays within C.
    clipper = PerSampleClipper(model, _squared_outputs, max_grad_norm=0.1, bookkeeping=True)
    stats = clipper.clipped_backward(x)
    assert (stats.factors < 1).all()
    summed = clipper.pop_summed_grads()
    assert float(torch.cat([g.flatten() for g in summed.values()]).norm()) <= 5 * 0.1 * (1 + 1e-9)


class _Bilinear(torch.nn.Module):
    """ℓ_i = b_iᵀ W a_i: the per-sample gradient b_i a_iᵀ is whatever the batch says (rank one)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim, bias=False)


def _bilinear_losses(model, batch):
    return (model.lin(batch["a"][:, None, :]) * batch["b"][:, None, :]).sum((1, 2))


def _pm_pairs(dim: int, scale: float, zero_first: bool) -> dict:
    """Pairs with gradients +s·e_j e_iᵀ and −s·e_j e_iᵀ (the audit's construction), optionally behind an
    example whose gradient is zero."""
    eye = torch.eye(dim, dtype=torch.float64)
    a = torch.cat([eye[i].repeat(2, 1) for i in range(dim)])
    b = torch.cat([torch.stack([scale * eye[(i + 1) % dim], -scale * eye[(i + 1) % dim]]) for i in range(dim)])
    if zero_first:
        a, b = torch.cat([torch.zeros(1, dim, dtype=torch.float64), a]), torch.cat([eye[:1], b])
    return {"a": a, "b": b}


def _step_sum(model, batch, physical, streams_key, world=1):
    """The clipped sum of one logical step (hutchinson, k = 32) over ``world`` simulated ranks, each
    holding examples i ≡ rank (mod world) and the same probe key, as under torch.distributed."""
    total = None
    for rank in range(world):
        rows = list(range(rank, batch["a"].shape[0], world))
        clipper = PerSampleClipper(
            model,
            _bilinear_losses,
            max_grad_norm=1.0,
            norm_mode="hutchinson",
            probes=32,
            randomness=SecureRandom.from_seed(streams_key, "probes"),
        )
        clipper.begin_step(1)
        try:
            PrivateModel(model, clipper, physical).clipped_backward({k: v[rows] for k, v in batch.items()})
            part = clipper.pop_summed_grads()[model.lin.weight]
        finally:
            clipper.capture.remove()
        total = part if total is None else total + part
    return total


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("physical", [None, 1, 2, 3])
def test_an_added_zero_gradient_example_changes_nothing(physical, world):
    """Regression for the audit's attack on per-micro-batch probes: ±g pairs cancel exactly whatever
    micro-batch or rank they land in, so inserting an example whose gradient is zero (which shifts every
    later example to another micro-batch / rank) leaves the clipped sum exactly 0; with probes drawn per
    micro-batch it had per-coordinate variance 0.034."""
    model = _Bilinear(8).double()
    for key in range(3):
        without = _step_sum(model, _pm_pairs(8, 2.0, zero_first=False), physical, key, world)
        with_zero = _step_sum(model, _pm_pairs(8, 2.0, zero_first=True), physical, key, world)
        assert torch.count_nonzero(without) == 0 and torch.count_nonzero(with_zero) == 0


@pytest.mark.parametrize("physical", [None, 2, 3])
def test_clip_factors_do_not_depend_on_batch_composition(physical):
    """Random rank-one gradients: each example's clip factor is a function of its own gradient and the
    step's probes, so the clipped sum with an added zero-gradient example equals the one without it, and
    two simulated ranks equal one process."""
    gen = torch.Generator().manual_seed(4)
    batch = {
        "a": torch.randn(9, 8, generator=gen, dtype=torch.float64),
        "b": 2 * torch.randn(9, 8, generator=gen, dtype=torch.float64),
    }
    padded = {
        "a": torch.cat([torch.zeros(1, 8, dtype=torch.float64), batch["a"]]),
        "b": torch.cat([torch.ones(1, 8, dtype=torch.float64), batch["b"]]),
    }
    model = _Bilinear(8).double()
    reference = _step_sum(model, batch, None, 5)
    for variant, world in ((batch, 2), (padded, 1), (padded, 2)):
        torch.testing.assert_close(_step_sum(model, variant, physical, 5, world), reference, rtol=1e-12, atol=1e-12)


def test_probes_need_a_step_and_are_fixed_within_it_and_fresh_across_steps():
    model = _Bilinear(8).double()
    gen = torch.Generator().manual_seed(2)
    batch = {
        "a": torch.randn(5, 8, generator=gen, dtype=torch.float64),
        "b": torch.randn(5, 8, generator=gen, dtype=torch.float64),
    }
    clipper = PerSampleClipper(model, _bilinear_losses, max_grad_norm=1.0, norm_mode="hutchinson", probes=4)
    try:
        with pytest.raises(RuntimeError, match="begin_step"):
            clipper.sq_norms(batch)
        clipper.begin_step(1)
        first, again = clipper.sq_norms(batch), clipper.sq_norms(batch)
        clipper.begin_step(2)
        second = clipper.sq_norms(batch)
    finally:
        clipper.capture.remove()
    assert torch.equal(first, again) and not torch.equal(first, second)
