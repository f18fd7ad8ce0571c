"""Filtering: label disagreements are dropped, classes rebalanced, survivors ranked by matching loss;
``label_filter = False`` (the ablation) keeps every candidate and never asks the few-shot classifier."""

from __future__ import annotations

import numpy as np
import pytest

import privlm.synthesis.gradmm.generate as generate
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.filtering import (
    PUBLIC_FEW_SHOT,
    Candidate,
    few_shot_context,
    few_shot_labels,
    few_shot_scores,
    select,
    uniform_draw,
)
from privlm.synthesis.gradmm.pipeline import run_gradmm
from privlm.synthesis.gradmm.prompt import build_prompt

PRIVATE = [
    ("a delight from start to finish", 1),
    ("slow, dull and far too long", 0),
    ("I loved every minute of it", 1),
    ("one of the worst films of the year", 0),
]


def _cand(text: str, label: int, loss: float) -> Candidate:
    return Candidate(ids=(1,), text=text, label=label, match_loss=loss)


def test_select_drops_disagreements_rebalances_and_ranks_by_loss() -> None:
    cands = [
        _cand("a", 0, 0.3),
        _cand("b", 0, 0.1),
        _cand("c", 0, 0.2),
        _cand("d", 1, 0.5),
        _cand("e", 1, 0.4),
        _cand("f", 1, 0.05),
    ]
    predicted = [0, 0, 0, 1, 1, 0]  # "f" (class 1, best loss) is predicted 0: dropped
    kept = select(cands, predicted, per_class=3, n_classes=2)
    assert [c.text for c in kept] == ["b", "c", "e", "d"]  # class 1 has 2 survivors, so each class keeps 2
    assert [c.text for c in select(cands, [c.label for c in cands], 1, 2)] == ["b", "f"]
    assert select(cands, [1, 1, 1, 1, 1, 1], 3, 2) == []  # a class without survivors empties the set


def test_few_shot_context_is_our_public_demonstrations_interleaved() -> None:
    _, tokenizer = build_tiny_model("tiny-llama", seed=0)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"], ["negative", "positive"])
    lines = few_shot_context(prompt).splitlines()
    expected = [
        f"{text} It was {word}"
        for pair in zip(PUBLIC_FEW_SHOT["bad"], PUBLIC_FEW_SHOT["great"])
        for text, word in zip(pair, ("bad", "great"))
    ]
    assert lines == expected  # only our own demonstrations, class by class in turn
    assert few_shot_context(prompt, only=1).splitlines() == expected[1::2]  # class "great" alone
    unknown = build_prompt(tokenizer, " It was ", ["meh", "great"], ["negative", "positive"])
    assert few_shot_context(unknown) == ""  # no demonstrations for a label word: zero-shot, never real examples


def test_label_filter_off_keeps_every_candidate(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("few_shot_labels called with label_filter off")

    monkeypatch.setattr(generate, "few_shot_labels", refuse)
    config = make_config(
        "demo", length=4, batch=3, outer_steps=2, inner_steps=2, top_k=8, seed=1, oversample=1.0, label_filter=False
    )
    model, tokenizer = build_tiny_model("tiny-llama", seed=2)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"], ["negative", "positive"])
    result = run_gradmm(
        model.requires_grad_(False),
        tokenizer,
        prompt,
        lambda: list(PRIVATE),
        out=tmp_path / "synth.jsonl",
        per_class=3,
        config=config,
        dp=False,
        epsilon=None,
        delta=None,
    )
    assert [r["label"] for r in result.rows] == [0, 0, 0, 1, 1, 1]
    losses = [r["match_loss"] for r in result.rows]
    assert losses[:3] == sorted(losses[:3]) and losses[3:] == sorted(losses[3:])


def test_class_context_starts_each_class_after_its_own_demonstrations(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    contexts = []
    real = generate.Projector

    def recording(model, tokenizer, context_ids, top_k):
        contexts.append(tokenizer.decode(list(context_ids)))
        return real(model, tokenizer, context_ids, top_k)

    monkeypatch.setattr(generate, "Projector", recording)
    config = make_config(
        "demo",
        length=4,
        batch=3,
        outer_steps=1,
        inner_steps=1,
        top_k=8,
        seed=1,
        oversample=1.0,
        label_filter=False,
        class_context=True,
    )
    model, tokenizer = build_tiny_model("tiny-llama", seed=2)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"], ["negative", "positive"])
    result = run_gradmm(
        model.requires_grad_(False),
        tokenizer,
        prompt,
        lambda: list(PRIVATE),
        out=tmp_path / "synth.jsonl",
        per_class=3,
        config=config,
        dp=False,
        epsilon=None,
        delta=None,
    )
    assert len(contexts) == 2 and len(result.rows) == 6
    assert "It was bad" in contexts[0] and "It was great" not in contexts[0]
    assert "It was great" in contexts[1] and "It was bad" not in contexts[1]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_few_shot_scores_equal_the_full_prompt_pass(name: str) -> None:
    """The demonstrations run once (a shared prefix); the scores equal the model's own pass over each whole
    ``context + text + suffix`` (float64), calibrated by the content-free input."""
    import torch

    model, tokenizer = build_tiny_model(name, seed=3, dtype=torch.float64)
    model.eval()
    prompt = build_prompt(tokenizer, "{text} It was ", ["bad", "great"], ["negative", "positive"])
    texts = ["a warm film", "it is slow and far too long, with a dull cast", "ok", "the plot"]
    context = prompt.with_context(tokenizer.encode(few_shot_context(prompt), add_special_tokens=False))
    labels = list(prompt.label_token_ids)

    def whole(text: str) -> torch.Tensor:
        ids = torch.tensor([[*context, *prompt.text_ids(tokenizer, text), *prompt.suffix_ids]])
        return torch.log_softmax(model(input_ids=ids).logits[0, -1, labels], dim=0)

    with torch.no_grad():
        expected = torch.stack([whole(t) for t in texts]) - whole("N/A")
    got = few_shot_scores(model, tokenizer, prompt, texts, batch_size=3)  # a batch across the padding
    assert len(context) > 30  # the demonstrations are there, and shared
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)
    assert few_shot_labels(model, tokenizer, prompt, texts, batch_size=3) == got.argmax(1).tolist()


def _draw_candidates() -> tuple[list[Candidate], list[int]]:
    """Ten candidates per class; the label filter gives candidates 0, 3 and 6 of each class the other class."""
    cands = [Candidate(ids=(k, i), text=f"{k}-{i}", label=k, match_loss=None) for i in range(10) for k in (0, 1)]
    predicted = [1 - c.label if c.ids[1] % 3 == 0 and c.ids[1] < 7 else c.label for c in cands]
    return cands, predicted


def test_uniform_draw_keeps_the_eligible_candidates_only_and_its_prefixes_are_smaller_draws() -> None:
    cands, predicted = _draw_candidates()
    chosen = uniform_draw(cands, predicted, 4, 2, seed=3)
    assert [c.label for c in chosen] == [0] * 4 + [1] * 4
    assert all(c.ids[1] not in (0, 3, 6) for c in chosen) and len(set(chosen)) == 8
    assert uniform_draw(cands, predicted, 4, 2, seed=3) == chosen != uniform_draw(cands, predicted, 4, 2, seed=4)
    everything = uniform_draw(cands, predicted, 100, 2, seed=3)  # capped by the fewest eligible (7 per class)
    assert len(everything) == 14 and [c for c in everything if c.label == 0][:4] == chosen[:4]


def test_uniform_draw_is_uniform_over_the_eligible_candidates() -> None:
    """Monte Carlo over 4,000 seeds: each of the 7 eligible candidates of a class is kept with probability 2/7
    (binomial sd about 0.007; 5 sd allowed)."""
    cands, predicted = _draw_candidates()
    counts: dict[tuple[int, int], int] = {}
    for seed in range(4000):
        for c in uniform_draw(cands, predicted, 2, 2, seed):
            counts[c.ids] = counts.get(c.ids, 0) + 1
    assert len(counts) == 14
    frequencies = np.array(list(counts.values())) / 4000
    assert np.abs(frequencies - 2 / 7).max() < 5 * np.sqrt(2 / 7 * 5 / 7 / 4000)
