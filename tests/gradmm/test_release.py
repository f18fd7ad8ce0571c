"""The DP release: closed-form clipped sums vs a per-sample autograd loop; noise scale; save/load."""

from __future__ import annotations

import dp_accounting
import pytest
import torch

from privlm.errors import UserError
from privlm.gradmm.prompt import build_prompt, encode_text
from privlm.gradmm.release import Release, clipped_class_sums, draw_release
from privlm.privacy.gaussian import gaussian_noise_multiplier
from privlm.resources.tiny import build_tiny_model

EXAMPLES = [
    ("the movie was a delight from start to finish", 1),
    ("slow, dull and far too long", 0),
    ("a warm, funny and moving story", 1),
    ("the plot makes no sense", 0),
    ("one of the worst films of the year", 0),
    ("I loved every minute of it", 1),
    ("wooden", 0),
]


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
    release = draw_release(model, tokenizer, EXAMPLES, prompt, epsilon=epsilon, delta=delta, clip=clip)
    noise = release.targets - clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=clip, max_tokens=64)
    assert noise.numel() >= 10**6
    sigma = gaussian_noise_multiplier(epsilon, delta)
    assert release.noise_multiplier == sigma
    assert abs(float(noise.std()) / (sigma * clip) - 1) < 0.01
    assert abs(float(noise.mean())) < 0.01 * sigma * clip
    for k in range(2):  # the public signal-to-noise statement: each class's noise has norm sigma * C * sqrt(V * d)
        assert float(noise[k].norm()) == pytest.approx(release.noise_norm(), rel=0.01)
    # The calibration itself, checked with an independent accountant: sigma spends epsilon at delta.
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(sigma))
    assert pld.get_epsilon(delta) == pytest.approx(epsilon, rel=1e-2)


def test_noise_is_not_reproducible() -> None:
    model, tokenizer = build_tiny_model("tiny-llama")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    a, b = (draw_release(model, tokenizer, EXAMPLES, prompt, epsilon=1.0, delta=1e-5) for _ in range(2))
    assert not torch.equal(a.targets, b.targets)


def test_no_dp_release_is_the_plain_sum_and_says_so() -> None:
    model, tokenizer = build_tiny_model("tiny-gpt2")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    release = draw_release(model, tokenizer, EXAMPLES, prompt, epsilon=None, delta=None, dp=False)
    plain = clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=None, max_tokens=64)
    assert torch.equal(release.targets, plain)
    assert not release.dp and release.epsilon is None and release.noise_multiplier is None and release.noise_norm() is None


def test_release_is_saved_when_drawn_and_loads_identically(tmp_path) -> None:
    model, tokenizer = build_tiny_model("tiny-llama")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    path = tmp_path / "sub" / "release.pt"
    release = draw_release(model, tokenizer, EXAMPLES, prompt, epsilon=4.0, delta=1e-5, save_to=path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["release.pt"]
    loaded = Release.load(path)
    assert torch.equal(loaded.targets, release.targets)
    assert loaded.sha256() == release.sha256()
    assert loaded.prompt == prompt and loaded.epsilon == 4.0


@pytest.mark.parametrize(
    "kwargs", [{"epsilon": 0.0, "delta": 1e-5}, {"epsilon": 1.0, "delta": 1.0}, {"epsilon": 1.0, "delta": 1e-5, "clip": -1.0}]
)
def test_bad_privacy_parameters_are_user_errors(kwargs: dict) -> None:
    model, tokenizer = build_tiny_model("tiny-llama")
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    with pytest.raises(UserError):
        draw_release(model, tokenizer, EXAMPLES, prompt, **kwargs)
