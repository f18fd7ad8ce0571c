"""The label-word head: at initialisation it is the model's own output layer restricted to the label words;
its predictions are the label-word scoring of the model with the trained rows in its output layer."""

from __future__ import annotations

import copy

import pytest
import torch

from privlm.errors import UserError
from privlm.lm.prompts import pad_token_id
from privlm.lm.scoring import option_scores
from privlm.resources.tiny import build_tiny_model
from privlm.resources.verbalizers import Verbalizer
from privlm.training.data import TaskData, encode, make_collate
from privlm.training.head import LabelWordHead, head_losses, label_token_ids
from privlm.training.prefix_cache import compute_features

VERBALIZER = Verbalizer(" It was ", ("good", "great", "film"))  # one tiny-tokenizer token each
TEXTS = tuple(f"review {i}: the film was " + "very " * (i % 4) + ("fine" if i % 2 else "slow") for i in range(9))
DATA = TaskData(
    "classify",
    tuple((t, i % 3) for i, t in enumerate(TEXTS)),
    tuple((t, i % 3) for i, t in enumerate(TEXTS)),
    VERBALIZER,
)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_the_initial_head_is_the_output_layer_at_the_label_position(name):
    model, tokenizer = build_tiny_model(name, seed=0, dtype=torch.float64)
    ids = label_token_ids(tokenizer, VERBALIZER)
    head = LabelWordHead(model, ids)
    batch = make_collate(tokenizer)(encode(DATA, tokenizer, 32))
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    last = batch["attention_mask"].sum(1) - 2  # the position predicting the (one-token) label word
    expected = logits[torch.arange(len(TEXTS)), last][:, ids]
    torch.testing.assert_close(head(batch), expected, rtol=1e-10, atol=1e-10)
    assert [n for n, p in head.named_parameters() if p.requires_grad] == ["rows.weight"]
    assert head_losses(head, batch).shape == (len(TEXTS),)


def test_head_predictions_are_the_label_word_scoring_with_the_trained_rows():
    model, tokenizer = build_tiny_model("tiny-llama", seed=0, dtype=torch.float64)
    ids = label_token_ids(tokenizer, VERBALIZER)
    head = LabelWordHead(copy.deepcopy(model), ids)
    with torch.no_grad():
        head.rows.weight.add_(
            torch.randn(head.rows.weight.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        )
    features = compute_features(
        head, encode(DATA, tokenizer, 32, split="test"), pad_token_id(tokenizer), 32, batch_size=4
    )
    ours = torch.log_softmax(head({"features": features}), 1)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untie, then put the rows in
    with torch.no_grad():
        model.lm_head.weight[ids] = head.rows.weight
    theirs = torch.from_numpy(
        option_scores(model, tokenizer, TEXTS, VERBALIZER.template, VERBALIZER.label_words, max_length=32)
    )
    assert torch.equal(ours.argmax(1), theirs.argmax(1))
    shift = theirs - ours  # full-vocabulary log-softmax vs K-way: one constant per text
    torch.testing.assert_close(shift, shift[:, :1].expand_as(shift), rtol=0, atol=1e-5)  # option_scores: float32


def test_label_words_sharing_a_first_token_are_refused():
    _, tokenizer = build_tiny_model("tiny-llama", seed=0)
    with pytest.raises(UserError, match="share a first token"):
        label_token_ids(tokenizer, Verbalizer(" It was ", ("good", "good")))
