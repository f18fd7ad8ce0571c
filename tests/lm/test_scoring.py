"""Label-word scoring against an unbatched, unpadded log-softmax reference; bootstrap interval."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privlm.errors import UserError
from privlm.lm import scoring
from privlm.lm.prompts import collate, encode_option, split_prompt
from privlm.lm.scoring import accuracy_ci, evaluate_accuracy, option_scores
from privlm.resources.tiny import build_tiny_model

TEXTS = [
    "A warm, funny and moving story with a wonderful cast.",
    "Dull.",
    "The plot makes no sense and the acting is wooden, and the film is far too long for what it has to say.",
]
SUFFIX = " It was "
WORDS = ["terrible", "great"]  # 4 tokens and 1 token in the tiny tokenizer


def reference_scores(model, tokenizer, text: str, word: str) -> tuple[float, float]:
    """Sum and mean log-probability of the word's tokens, from one unpadded sequence."""
    ids = tokenizer(text + SUFFIX.rstrip() + " " + word)["input_ids"]
    n_word = len(tokenizer(" " + word)["input_ids"])
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
    total = sum(float(logp[pos - 1, ids[pos]]) for pos in range(len(ids) - n_word, len(ids)))
    return total, total / n_word


def test_split_prompt_moves_trailing_space_to_word() -> None:
    assert split_prompt("nice", " It was ", "great") == ("nice It was", " great")
    assert split_prompt("nice", " It was", "great") == ("nice It was", "great")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_option_scores_equal_unpadded_reference(name: str) -> None:
    model, tok = build_tiny_model(name, seed=3)
    for normalize, which in [(False, 0), (True, 1)]:
        got = option_scores(model, tok, TEXTS, SUFFIX, WORDS, batch_size=4, normalize=normalize)
        want = np.array([[reference_scores(model, tok, t, w)[which] for w in WORDS] for t in TEXTS])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_single_token_words_take_the_one_forward_path_and_match_the_reference(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def general_path(*args, **kwargs):
        raise AssertionError("single-token label words should not take the per-option path")

    monkeypatch.setattr(scoring, "_score_each_option", general_path)
    model, tok = build_tiny_model(name, seed=4)
    words = ["great", "the", "was"]  # one token each after " It was"
    assert all(len(tok(" " + w)["input_ids"]) == 1 for w in words)
    got = option_scores(model, tok, TEXTS, SUFFIX, words, batch_size=2)
    want = np.array([[reference_scores(model, tok, t, w)[0] for w in words] for t in TEXTS])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_option_scores_do_not_depend_on_batch_size() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=1)
    one = option_scores(model, tok, TEXTS, SUFFIX, WORDS, batch_size=1)
    many = option_scores(model, tok, TEXTS, SUFFIX, WORDS, batch_size=6)
    np.testing.assert_allclose(one, many, rtol=1e-5, atol=1e-5)


def test_encoding_matches_whole_string_tokenization_and_truncates_from_left() -> None:
    _, tok = build_tiny_model("tiny-llama")
    enc = encode_option(tok, TEXTS[0], SUFFIX, "terrible", max_length=512)
    assert enc.input_ids == tok(TEXTS[0] + " It was terrible")["input_ids"]
    assert enc.n_option_tokens == 4
    short = encode_option(tok, TEXTS[0], SUFFIX, "terrible", max_length=8)
    assert short.input_ids == enc.input_ids[-8:]
    with pytest.raises(UserError, match="terrible"):
        encode_option(tok, TEXTS[0], SUFFIX, "terrible", max_length=4)


def test_collate_masks_context_and_padding() -> None:
    _, tok = build_tiny_model("tiny-llama")
    options = [encode_option(tok, t, SUFFIX, "terrible", 512) for t in TEXTS[:2]]
    batch = collate(options, pad_token_id=0)
    long, short = (len(o.input_ids) for o in options)
    assert batch["attention_mask"][1].sum() == short
    assert (batch["labels"][1, short:] == -100).all()
    assert batch["labels"][0, long - 4 :].tolist() == options[0].input_ids[-4:]
    assert (batch["labels"][0, : long - 4] == -100).all()


def test_evaluate_accuracy_is_argmax_of_scores() -> None:
    model, tok = build_tiny_model("tiny-gpt2", seed=2)
    scores = option_scores(model, tok, TEXTS, SUFFIX, WORDS)
    pred = scores.argmax(axis=1)
    examples = [(t, int(p)) for t, p in zip(TEXTS, pred)]
    assert evaluate_accuracy(model, tok, examples, SUFFIX, WORDS).value == 1.0
    flipped = [(t, 1 - y) for t, y in examples]
    assert evaluate_accuracy(model, tok, flipped, SUFFIX, WORDS).value == 0.0


def test_bootstrap_interval_matches_normal_approximation_for_large_n() -> None:
    rng = np.random.default_rng(7)
    correct = rng.random(4000) < 0.7
    acc = accuracy_ci(correct, seed=0)
    half = 1.959964 * np.sqrt(acc.value * (1 - acc.value) / correct.size)
    assert acc.low < acc.value < acc.high
    assert acc.low == pytest.approx(acc.value - half, abs=0.004)
    assert acc.high == pytest.approx(acc.value + half, abs=0.004)
    assert accuracy_ci(correct, seed=0) == acc  # seeded


def test_bootstrap_interval_degenerate_and_bad_input() -> None:
    assert accuracy_ci(np.ones(5)).as_dict() == {"accuracy": 1.0, "ci_low": 1.0, "ci_high": 1.0, "n_test": 5}
    with pytest.raises(UserError):
        accuracy_ci(np.array([]))
