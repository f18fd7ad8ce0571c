"""Per-sample norms of exact/ghost/mixed equal the micro-batch-of-one autograd reference (float64,
rtol 1e-6) on tiny Llama and GPT-2 (tied embeddings), padded and masked, with and without LoRA."""

from __future__ import annotations

import pytest
import torch
from dpsgd_harness import padded_batch, reference_grads, reference_sq_norms, tiny_model

from privlm.dpsgd.clipping import PerSampleClipper
from privlm.dpsgd.losses import causal_lm_losses
from privlm.randomness import SecureRandom


@pytest.fixture(scope="module")
def cases():
    """(model, batch, reference squared norms) per (model name, lora), built once."""
    out = {}
    for name in ("tiny-llama", "tiny-gpt2"):
        for variant in ("tied", "lora", "untied"):
            model = tiny_model(name, lora=variant == "lora", untied=variant == "untied")
            batch = padded_batch([12, 7, 3, 10], seq_len=12)
            out[name, variant] = (model, batch, reference_sq_norms(reference_grads(model, batch)))
    return out


@pytest.mark.parametrize("mode", ["exact", "ghost", "mixed"])
@pytest.mark.parametrize("variant", ["tied", "lora", "untied"])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_exact_modes_match_reference(cases, name, variant, mode):
    model, batch, expected = cases[name, variant]
    clipper = PerSampleClipper(model, causal_lm_losses, max_grad_norm=1.0, norm_mode=mode)
    try:
        got = clipper.sq_norms(batch)
    finally:
        clipper.capture.remove()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)


def test_tiny_models_really_tie_embeddings(cases):
    for name in ("tiny-llama", "tiny-gpt2"):
        model = cases[name, "tied"][0]
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
        untied = cases[name, "untied"][0]
        assert untied.get_output_embeddings().weight is not untied.get_input_embeddings().weight


def test_mean_reduction_matches_reference(cases):
    model, batch, _ = cases["tiny-llama", "tied"]
    expected = reference_sq_norms(reference_grads(model, batch, reduction="mean"))
    clipper = PerSampleClipper(
        model, lambda m, b: causal_lm_losses(m, b, reduction="mean"), max_grad_norm=1.0, norm_mode="ghost"
    )
    try:
        got = clipper.sq_norms(batch)
    finally:
        clipper.capture.remove()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("mode", ["hutchinson", "hutchpp"])
def test_randomized_modes_average_to_reference(cases, mode):
    """Whole-model sanity check: the mean of 60 estimates is within 4 standard errors of the truth."""
    model, batch, expected = cases["tiny-gpt2", "tied"]  # tied embedding: shared probes
    clipper = PerSampleClipper(
        model,
        causal_lm_losses,
        max_grad_norm=1.0,
        norm_mode=mode,
        probes=6,
        randomness=SecureRandom.from_seed(3, "probes"),
    )
    try:
        draws = []
        for step in range(1, 61):  # fresh probes per logical step
            clipper.begin_step(step)
            draws.append(clipper.sq_norms(batch))
        draws = torch.stack(draws)
    finally:
        clipper.capture.remove()
    se = draws.std(0) / 60**0.5
    assert ((draws.mean(0) - expected).abs() <= 4 * se + 1e-9 * expected).all()


def test_half_precision_factors_are_normed_in_float32():
    from privlm.dpsgd.norms.factors import OuterFactor, sq_norms

    gen = torch.Generator().manual_seed(0)
    left, right = torch.randn(3, 5, 7, generator=gen), torch.randn(3, 5, 4, generator=gen)
    half = [OuterFactor(left.to(torch.bfloat16), right.to(torch.bfloat16), rows=7)]
    got = sq_norms(half, "exact", 1, lambda *_: pytest.fail("exact norms draw no probes"))
    reference = torch.einsum("btr,btc->brc", left.to(torch.bfloat16).double(), right.to(torch.bfloat16).double())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference.pow(2).sum((1, 2)), rtol=1e-5, atol=0)


@pytest.mark.parametrize("mode", ["exact", "ghost", "mixed", "hutchinson", "hutchpp"])
def test_norms_and_clipped_sums_leave_an_autocast_region(mode):
    """Inside bf16 autocast (a ``--precision bf16`` step's backward) the matrix products of the norms and of
    the clipped sum would run in bf16 whatever their inputs; both must give exactly their float32 values."""
    from privlm.dpsgd.norms.factors import OuterFactor, sq_norms, weighted_sum

    gen = torch.Generator().manual_seed(1)
    factors = [OuterFactor(torch.randn(3, 40, 24, generator=gen), torch.randn(3, 40, 16, generator=gen), rows=24)]
    probes = SecureRandom.from_seed(0, "probes")

    def draw(columns, dtype, device):
        return probes.normal((24, columns), (1, 0), dtype=dtype, device=device)

    c = torch.tensor([0.3, 1.0, 0.7])
    plain = sq_norms(factors, mode, 9, draw), weighted_sum(factors, c, torch.Size([24, 16]))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = sq_norms(factors, mode, 9, draw), weighted_sum(factors, c, torch.Size([24, 16]))
    assert inside[0].dtype == inside[1].dtype == torch.float32
    assert torch.equal(inside[0], plain[0]) and torch.equal(inside[1], plain[1])
