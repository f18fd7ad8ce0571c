"""The head-only downstream classifier: its features are the hidden state that predicts the label word (as the
head-only training reads it), with no training set it is the model's own zero-shot label-word classifier
(against the option-scoring accuracy), the fit learns a separable problem, is seeded, and bad settings are
refused."""

from __future__ import annotations

import pytest
import torch

from privlm.errors import UserError
from privlm.lm.prompts import collate, encode_option, pad_token_id
from privlm.lm.scoring import evaluate_accuracy
from privlm.resources.tiny import build_tiny_model
from privlm.resources.verbalizers import Verbalizer
from privlm.training.head import LabelWordHead, label_token_ids
from privlm.training.head_probe import fit_rows, head_probe, prompt_features
from privlm.training.head_probe_config import HeadProbeConfig

TEMPLATE = "Review: {text} It was "
WORDS = ("good", "great")  # one token each with the tiny tokenizer: option scoring is then the head's argmax
TEXTS = [f"the film {'was ' * (i % 4)}{w}" for i, w in enumerate(["slow", "fun", "dull", "warm", "long", "smart"] * 3)]
EXAMPLES = [(t, i % 2) for i, t in enumerate(TEXTS)]


def _model():
    return build_tiny_model("tiny-llama", seed=0, dtype=torch.float64)


def test_prompt_features_are_the_hidden_state_predicting_the_label_word():
    model, tokenizer = _model()
    rows = [encode_option(tokenizer, t, TEMPLATE, WORDS[y], 64) for t, y in EXAMPLES]
    ids = label_token_ids(tokenizer, Verbalizer(TEMPLATE, WORDS))
    head = LabelWordHead(build_tiny_model("tiny-llama", seed=0, dtype=torch.float64)[0], ids)
    expected = head.features(collate(rows, pad_token_id(tokenizer)))
    got = prompt_features(model, tokenizer, TEXTS, TEMPLATE, 64)
    assert got.shape == (len(TEXTS), 32)
    # the same positions; other batch widths round eager attention's float32 softmax differently (≈ 6e-8)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_without_a_training_set_it_is_the_zero_shot_label_word_classifier():
    model, tokenizer = _model()
    test_features = prompt_features(model, tokenizer, TEXTS, TEMPLATE, 64)
    classes = torch.tensor([y for _, y in EXAMPLES])
    got = head_probe(model, tokenizer, [], test_features, classes, TEMPLATE, WORDS, HeadProbeConfig(), seed=0)
    expected = evaluate_accuracy(model, tokenizer, EXAMPLES, TEMPLATE, WORDS, max_length=64)
    assert got["head_accuracy"] == pytest.approx(expected.value)
    assert got["head_ci_low"] <= got["head_accuracy"] <= got["head_ci_high"]


def test_the_fit_learns_a_separable_problem_and_is_seeded():
    gen = torch.Generator().manual_seed(0)
    direction = torch.randn(16, generator=gen, dtype=torch.float64)
    features = torch.randn(200, 16, generator=gen, dtype=torch.float64)
    classes = (features @ direction > 0).long()
    initial = torch.zeros(2, 16, dtype=torch.float64)
    config = HeadProbeConfig(epochs=30, lr=0.05, batch_size=32)
    rows = fit_rows(initial, features, classes, config, seed=0)
    assert float(((features @ rows.T).argmax(1) == classes).double().mean()) > 0.95
    assert torch.equal(rows, fit_rows(initial, features, classes, config, seed=0))
    assert not torch.equal(rows, fit_rows(initial, features, classes, config, seed=1))
    assert torch.equal(fit_rows(initial, features[:0], classes[:0], config, seed=0), initial)


def test_training_on_the_test_texts_themselves_beats_zero_shot():
    """Fitted on the very examples it is scored on (a sanity check of the whole path, not a measurement)."""
    model, tokenizer = _model()
    test_features = prompt_features(model, tokenizer, TEXTS, TEMPLATE, 64)
    classes = torch.tensor([y for _, y in EXAMPLES])
    config = HeadProbeConfig(epochs=200, lr=0.05, batch_size=8)
    zero = head_probe(model, tokenizer, [], test_features, classes, TEMPLATE, WORDS, config, seed=0)
    fitted = head_probe(model, tokenizer, EXAMPLES, test_features, classes, TEMPLATE, WORDS, config, seed=0)
    assert fitted["head_accuracy"] > zero["head_accuracy"]


@pytest.mark.parametrize(
    ("field", "value"), [("epochs", 0), ("batch_size", 1.5), ("max_length", True), ("lr", 0), ("lr", "fast")]
)
def test_bad_settings_are_refused_by_name(field, value):
    with pytest.raises(UserError, match=f"head_probe.{field}"):
        HeadProbeConfig(**{field: value})
