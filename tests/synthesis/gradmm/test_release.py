"""The DP release: closed-form clipped sums vs a per-sample autograd loop (all rows and label rows);
sensitivity on neighbouring data sets; noise scale; the noise-only control; save/load."""

from __future__ import annotations

import dp_accounting
import pytest
import torch

from privlm.errors import UserError
from privlm.privacy.calibration import gaussian_releases_epsilon
from privlm.privacy.gaussian import gaussian_noise_multiplier
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm.prompt import build_prompt, encode_text
from privlm.synthesis.gradmm.release import (
    Release,
    clipped_class_sums,
    draw_release,
    private_factors,
    release_noise_multiplier,
    released_rows,
)

EXAMPLES = [
    ("the movie was a delight from start to finish", 1),
    ("slow, dull and far too long", 0),
    ("a warm, funny and moving story", 1),
    ("the plot makes no sense", 0),
    ("one of the worst films of the year", 0),
    ("I loved every minute of it", 1),
    ("wooden", 0),
]


def _factors(model, tokenizer, prompt, examples=EXAMPLES):
    return private_factors(model, tokenizer, examples, prompt, max_tokens=64)


def _untied_head_gradients(name: str, prompt, tokenizer) -> list[torch.Tensor]:
    """Per-sample LM-head gradients by plain autograd, one example at a time, head untied from the input."""
    model, _ = build_tiny_model(name, seed=2, dtype=torch.float64)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    grads = []
    for text, label in EXAMPLES:
        ids = torch.tensor([encode_text(tokenizer, prompt, text, max_tokens=64)])
        logits = model(input_ids=ids).logits[0, -1]
        loss = torch.nn.functional.cross_entropy(logits[None], torch.tensor([prompt.label_token_ids[label]]))
        (grad,) = torch.autograd.grad(loss, model.lm_head.weight)
        grads.append(grad)
    return grads


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_clipped_class_sums_match_per_sample_autograd_loop(name: str) -> None:
    model, tokenizer = build_tiny_model(name, seed=2, dtype=torch.float64)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    grads = _untied_head_gradients(name, prompt, tokenizer)
    norms = torch.stack([g.norm() for g in grads])
    clip = float(norms.median())  # some examples clipped, some not
    assert (norms > clip).any() and (norms < clip).any()
    for c in (clip, None):
        expected = torch.zeros(2, *grads[0].shape, dtype=torch.float64)
        for g, (_, label) in zip(grads, EXAMPLES):
            expected[label] += g * (1.0 if c is None else min(1.0, c / float(g.norm())))
        got = clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=c, max_tokens=64, batch_size=3)
        torch.testing.assert_close(got.to(torch.float64), expected, rtol=1e-5, atol=1e-6)


def test_noise_std_matches_calibration_over_a_million_coordinates() -> None:
    model, tokenizer = build_tiny_model("tiny-llama", hidden_size=1024, layers=1, heads=4)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    epsilon, delta, clip = 2.0, 1e-5, 0.5
    release = draw_release(model, prompt, _factors(model, tokenizer, prompt), epsilon=epsilon, delta=delta, clip=clip)
    noise = release.targets - clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=clip, max_tokens=64)
    assert noise.numel() >= 10**6
    sigma = release.noise_multiplier
    assert sigma == release_noise_multiplier(epsilon, delta, release.snapped)
    assert 1 <= sigma / gaussian_noise_multiplier(epsilon, delta) < 1.002  # the slack costs a hair more noise
    assert abs(float(noise.std()) / (sigma * clip) - 1) < 0.01
    assert abs(float(noise.mean())) < 0.01 * sigma * clip
    for k in range(2):  # the public signal-to-noise statement: each class's noise has norm sigma * C * sqrt(|R| * d)
        assert float(noise[k].norm()) == pytest.approx(release.noise_norm(), rel=0.01)
    # The calibration itself, checked with an independent accountant: sigma spends epsilon at delta.
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(sigma))
    assert pld.get_epsilon(delta) == pytest.approx(epsilon, rel=1e-2)
    # ... and the ledger's accountant, slack included, never reports more than the requested epsilon
    assert gaussian_releases_epsilon(sigma, 1, delta, release.snapped) <= epsilon


def test_noise_is_not_reproducible() -> None:
    model, tokenizer = build_tiny_model("tiny-llama")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    a, b = (draw_release(model, prompt, _factors(model, tokenizer, prompt), epsilon=1.0, delta=1e-5) for _ in range(2))
    assert not torch.equal(a.targets, b.targets)


def test_no_dp_release_is_the_plain_sum_and_says_so() -> None:
    model, tokenizer = build_tiny_model("tiny-gpt2")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    release = draw_release(model, prompt, _factors(model, tokenizer, prompt), epsilon=None, delta=None, dp=False)
    plain = clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=None, max_tokens=64)
    assert torch.equal(release.targets, plain)
    assert (
        not release.dp and release.epsilon is None and release.noise_multiplier is None and release.noise_norm() is None
    )


def test_release_is_saved_when_drawn_and_loads_identically(tmp_path) -> None:
    model, tokenizer = build_tiny_model("tiny-llama")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    path = tmp_path / "sub" / "release.pt"
    release = draw_release(model, prompt, _factors(model, tokenizer, prompt), epsilon=4.0, delta=1e-5, save_to=path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["release.pt"]
    loaded = Release.load(path)
    assert torch.equal(loaded.targets, release.targets)
    assert loaded.sha256() == release.sha256()
    assert loaded.prompt == prompt and loaded.epsilon == 4.0


@pytest.mark.parametrize(
    "kwargs",
    [{"epsilon": 0.0, "delta": 1e-5}, {"epsilon": 1.0, "delta": 1.0}, {"epsilon": 1.0, "delta": 1e-5, "clip": -1.0}],
)
def test_bad_privacy_parameters_are_user_errors(kwargs: dict) -> None:
    model, tokenizer = build_tiny_model("tiny-llama")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    with pytest.raises(UserError):
        draw_release(model, prompt, _factors(model, tokenizer, prompt), **kwargs)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_label_row_sums_are_the_label_rows_of_the_full_gradient_clipped_in_those_rows(name: str) -> None:
    model, tokenizer = build_tiny_model(name, seed=2, dtype=torch.float64)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    rows = released_rows(prompt, "label-rows")
    assert rows == prompt.label_token_ids
    full = clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=None, max_tokens=64)
    got = clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=None, max_tokens=64, rows=rows)
    torch.testing.assert_close(got, full[:, list(rows)], rtol=1e-12, atol=1e-12)
    # Clipped: each per-sample autograd gradient, restricted to the label rows, clipped to C there.
    grads = [g[list(rows)] for g in _untied_head_gradients(name, prompt, tokenizer)]
    clip = float(torch.stack([g.norm() for g in grads]).median())
    expected = torch.zeros(2, *grads[0].shape, dtype=torch.float64)
    for g, (_, label) in zip(grads, EXAMPLES):
        expected[label] += g * min(1.0, clip / float(g.norm()))
    got = clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=clip, max_tokens=64, rows=rows)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)  # autograd path differs in rounding only


@pytest.mark.parametrize("release", ["label-rows", "full"])
def test_a_neighbouring_data_set_moves_the_sums_by_at_most_c(release: str) -> None:
    model, tokenizer = build_tiny_model("tiny-llama", seed=2, dtype=torch.float64)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    rows = released_rows(prompt, release)
    clip = 0.05  # below every example's norm here: each one moves the sums by exactly C
    full = clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=clip, max_tokens=64, rows=rows)
    for i in range(len(EXAMPLES)):
        neighbour = EXAMPLES[:i] + EXAMPLES[i + 1 :]
        moved = full - clipped_class_sums(model, tokenizer, neighbour, prompt, clip=clip, max_tokens=64, rows=rows)
        assert float(moved.norm()) == pytest.approx(clip, rel=1e-9)
        assert float(moved[1 - EXAMPLES[i][1]].norm()) < 1e-12  # the other class does not move


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_an_example_with_a_non_finite_hidden_state_is_left_out_of_the_clipped_sums(bad: float) -> None:
    """One private example whose hidden state overflowed: the clipped sums are those of the others (a NaN would
    otherwise make its class's released target NaN — a data-dependent, unnoised output)."""
    from privlm.synthesis.gradmm.release import PrivateFactors, factor_class_sums

    model, tokenizer = build_tiny_model("tiny-llama", seed=2, dtype=torch.float64)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    factors = _factors(model, tokenizer, prompt)
    hidden = factors.hidden.clone()
    hidden[3, 0] = bad
    poisoned = PrivateFactors(hidden, factors.labels)
    others = PrivateFactors(
        torch.cat([factors.hidden[:3], factors.hidden[4:]]), torch.cat([factors.labels[:3], factors.labels[4:]])
    )
    for rows in (released_rows(prompt, "label-rows"), None):
        got = factor_class_sums(model, poisoned, prompt, clip=0.05, rows=rows, batch_size=3)
        torch.testing.assert_close(got, factor_class_sums(model, others, prompt, clip=0.05, rows=rows, batch_size=3))


def test_noise_only_release_takes_no_factors_and_is_noise_at_the_same_sigma() -> None:
    model, tokenizer = build_tiny_model("tiny-llama", hidden_size=512, layers=1, heads=4)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    release = draw_release(model, prompt, None, epsilon=2.0, delta=1e-5, clip=0.5, rows=None)
    assert release.noise_only and release.dp
    sigma = release_noise_multiplier(2.0, 1e-5, release.snapped)
    assert release.noise_multiplier == sigma
    assert abs(float(release.targets.std()) / (sigma * 0.5) - 1) < 0.01
    with pytest.raises(UserError, match="noise-only"):
        draw_release(model, prompt, None, epsilon=None, delta=None, dp=False)


def test_unknown_release_kind_names_the_choices() -> None:
    _, tokenizer = build_tiny_model("tiny-llama")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    with pytest.raises(UserError, match="label-rows, full"):
        released_rows(prompt, "rows")


def test_label_row_release_is_small_and_says_so(tmp_path) -> None:
    model, tokenizer = build_tiny_model("tiny-llama")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    rows = released_rows(prompt, "label-rows")
    release = draw_release(
        model, prompt, _factors(model, tokenizer, prompt), epsilon=1.0, delta=1e-5, rows=rows, save_to=tmp_path / "r.pt"
    )
    d = model.get_output_embeddings().weight.shape[1]
    assert release.targets.shape == (2, 2, d) and release.released_dim == 2 * d
    assert release.noise_norm() == pytest.approx(release.noise_multiplier * (2 * d) ** 0.5)
    assert Release.load(tmp_path / "r.pt").rows == rows


def test_a_whole_split_sized_signal_is_not_cut_by_snapping_and_its_slack_is_counted() -> None:
    from privlm.privacy.snapping import grid
    from privlm.synthesis.gradmm.release import add_gaussian_noise, clamp_bits

    sums = torch.zeros(2, 2, 576)
    sums[:, :, :8] = 4000.0  # a class sum of 4,000 clipped examples can reach n·C in a coordinate
    std = gaussian_noise_multiplier(4.0, 1e-5)
    for rows, cut in (((1, 2), False), (None, True)):
        bits = clamp_bits(rows)
        noise = add_gaussian_noise(sums, std, bits) - sums
        assert (float(noise.norm()) > 1000) is cut  # the default clamp (2⁸σ) cuts 4,000; 2¹⁶σ does not
        step, _ = grid(std, bits)
        assert torch.equal((sums + noise).double() / step, ((sums + noise).double() / step).round())  # on the grid
    release = Release(
        targets=sums,
        prompt=None,
        dp=True,
        epsilon=4.0,
        delta=1e-5,
        noise_multiplier=std,
        clip=1.0,
        max_tokens=64,
        model_fingerprint="",
        rows=(1, 2),
    )
    assert release.snapped == sums.numel() * 2**8
