"""Nucleus filtering without a full sort (:class:`privlm.lm.nucleus.NucleusFilter`) against transformers' own
``TemperatureLogitsWarper`` + ``TopPLogitsWarper``: the same scores out, row for row, and the same samples from
``generate``; rows it cannot decide go to the warper."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from privlm.errors import UserError
from privlm.lm.nucleus import NucleusFilter
from privlm.resources.tiny import build_tiny_model

VOCAB = 49_152  # SmolLM2's


def _warpers(scores: torch.Tensor, top_p: float, temperature: float) -> torch.Tensor:
    ids = torch.zeros(scores.shape[0], 1, dtype=torch.long)
    return TopPLogitsWarper(top_p)(ids, TemperatureLogitsWarper(temperature)(ids, scores))


def _rows(generator: torch.Generator) -> torch.Tensor:
    """Next-token-like rows from flat to peaked: Gaussian logits at several scales and Zipf-shaped ones."""
    gaussian = [torch.randn(6, VOCAB, generator=generator) * scale for scale in (0.5, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)]
    ranks = torch.arange(1, VOCAB + 1, dtype=torch.float32)
    zipf = [
        (-exponent * ranks.log())[torch.randperm(VOCAB, generator=generator)]
        for exponent in (1.0, 1.3, 1.5, 1.7, 2.0, 3.0)
        for _ in range(4)
    ]
    return torch.cat([*gaussian, torch.stack(zipf)])


@pytest.mark.parametrize(("top_p", "temperature"), [(0.95, 1.0), (0.9, 0.7), (0.5, 1.3), (0.99, 1.0)])
def test_the_filter_gives_the_warpers_scores_on_rows_from_flat_to_peaked(top_p, temperature) -> None:
    scores = _rows(torch.Generator().manual_seed(0))
    ids = torch.zeros(scores.shape[0], 1, dtype=torch.long)
    nucleus = NucleusFilter(top_p, temperature)
    ours = nucleus(ids, scores)
    assert torch.equal(ours, _warpers(scores, top_p, temperature))
    # nuclei within the first candidates, the second, and beyond both
    kept = torch.isfinite(ours).sum(-1)
    assert (kept < 512).any() and ((kept > 512) & (kept < 4096)).any() and (kept > 4096).any()
    # not vacuous: the warper sees the rows beyond the largest candidate and a few others (a boundary in the margin)
    assert nucleus.rows == scores.shape[0]
    assert nucleus.rows_to_warper <= int((kept >= 4096).sum()) + scores.shape[0] // 4


def test_a_tie_across_the_boundary_goes_to_the_warper() -> None:
    scores = torch.full((1, 64), -30.0)
    scores[0, [3, 17, 40]] = 0.0  # a third each: at top-p 0.5 two are kept, and which two is the sort's choice
    ids, nucleus = torch.zeros(1, 1, dtype=torch.long), NucleusFilter(0.5)
    assert torch.equal(nucleus(ids, scores), _warpers(scores, 0.5, 1.0))
    assert nucleus.rows_to_warper == 1


@pytest.mark.parametrize(
    "probs",
    [
        [0.5, 0.45, 0.05],  # the first token removed has a mass of 1 − top_p up to rounding
        [0.5, 0.4499996, 0.04, 0.0100004],  # the last token kept has a mass 4·10⁻⁷ above it
    ],
)
def test_a_mass_within_the_margin_of_the_threshold_goes_to_the_warper(probs) -> None:
    scores = torch.tensor([probs]).log()
    ids, nucleus = torch.zeros(1, 1, dtype=torch.long), NucleusFilter(0.95)
    assert torch.equal(nucleus(ids, scores), _warpers(scores, 0.95, 1.0))
    assert nucleus.rows_to_warper == 1
    unguarded = NucleusFilter(0.95, margin=(0.0, 0.0))  # without the margin it would decide the row
    assert unguarded._decide(scores, torch.logsumexp(scores.double(), -1), len(probs))[0].all()


@pytest.mark.parametrize("offset", [1.05e-6, -1.05e-6, 1e-5, -1e-5])
def test_at_a_low_top_p_a_boundary_within_the_warpers_larger_rounding_goes_to_the_warper(offset) -> None:
    # a flat tail and one placed token A: the mass of B (the runner-up) and below is 1 − top_p + offset
    generator, rows = torch.Generator().manual_seed(5), 64
    scores = torch.randn(rows, VOCAB, generator=generator) * 0.3
    scores[:, 1] = scores[:, 2:].max(1).values + 1.0
    rest = torch.exp(scores[:, 1:].double()).sum(1)
    nucleus = NucleusFilter(0.1)
    share = 1 - (nucleus.threshold + offset)  # A's share of the mass
    scores[:, 0] = torch.log(share * rest / (1 - share)).float()
    ascending = torch.sort(scores).values
    rounding = (ascending.softmax(-1).cumsum(-1).double() - ascending.double().softmax(-1).cumsum(-1))[:, -2].abs()
    assert rounding.max() > 3e-7  # near 0.9 the warper's float32 mass is off by far more than near 0.05 …
    assert nucleus.margin > 10 * rounding.max()  # … and the margin grows with it
    ids = torch.zeros(rows, 1, dtype=torch.long)
    assert torch.equal(nucleus(ids, scores), _warpers(scores, 0.1, 1.0))
    assert nucleus.rows_to_warper == rows


def test_rows_with_excluded_tokens_keep_them_excluded() -> None:
    scores = torch.randn(3, 600, generator=torch.Generator().manual_seed(2)) * 4
    scores[0, ::2] = -float("inf")  # half the vocabulary excluded by an earlier processor
    scores[1, 1:] = -float("inf")  # one token left
    scores[2, :] = -float("inf")  # nothing left: the warper's answer
    ids = torch.zeros(3, 1, dtype=torch.long)
    assert torch.equal(NucleusFilter(0.9)(ids, scores), _warpers(scores, 0.9, 1.0))


def test_top_p_one_only_divides_by_the_temperature_and_bad_settings_are_refused() -> None:
    scores = torch.randn(2, 10, generator=torch.Generator().manual_seed(1))
    ids = torch.zeros(2, 1, dtype=torch.long)
    assert torch.equal(NucleusFilter(1.0, 2.0)(ids, scores), scores / 2.0)
    for top_p, temperature in ((0.0, 1.0), (1.5, 1.0), (0.9, 0.0)):
        with pytest.raises(UserError):
            NucleusFilter(top_p, temperature)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_generate_draws_the_samples_of_its_own_warpers(name) -> None:
    model, tokenizer = build_tiny_model(name, seed=4)
    ids = torch.tensor([[5, 6, 7, 8, 9]] * 6)
    settings = dict(do_sample=True, top_k=0, max_new_tokens=12, pad_token_id=tokenizer.pad_token_id or 0)
    samples, nucleus = [], NucleusFilter(0.9, 0.8)
    for extra in (
        dict(top_p=0.9, temperature=0.8),
        dict(top_p=1.0, temperature=1.0, logits_processor=LogitsProcessorList([nucleus])),
    ):
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(3)
            samples.append(model.generate(ids, **settings, **extra))
    assert torch.equal(samples[0], samples[1])
    assert nucleus.rows == 6 * 12 and nucleus.rows_to_warper < nucleus.rows  # it decided rows itself
