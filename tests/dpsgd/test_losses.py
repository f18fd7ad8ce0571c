"""Token-level per-sample losses: padding and ignore_index contribute nothing; sum or mean. The label-word
objective is a K-way softmax over the label tokens."""

from __future__ import annotations

import math

import pytest
import torch

from privlm.dpsgd.losses import (
    IGNORE_INDEX,
    causal_lm_labels,
    label_word_lm_losses,
    label_word_targets,
    token_losses,
)
from privlm.lm.prompts import EncodedOption, collate
from privlm.resources.tiny import build_tiny_model


def _manual(logits, labels, reduction):
    out = []
    for lg, lb in zip(logits, labels):
        terms = [-torch.log_softmax(lg[t], -1)[lb[t]] for t in range(len(lb)) if lb[t] != IGNORE_INDEX]
        total = sum(terms) if terms else torch.tensor(0.0, dtype=lg.dtype)
        out.append(total / len(terms) if reduction == "mean" and terms else total)
    return torch.stack(out)


def test_token_losses_match_a_manual_loop():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 7, (3, 5), generator=gen)
    labels[0, :2] = IGNORE_INDEX
    labels[2] = IGNORE_INDEX  # no target at all: loss 0
    for reduction in ("sum", "mean"):
        torch.testing.assert_close(token_losses(logits, labels, reduction), _manual(logits, labels, reduction))
    assert token_losses(logits, labels)[2] == 0


def test_masked_positions_do_not_matter():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64)
    labels = torch.tensor([[1, 2, IGNORE_INDEX, 3], [IGNORE_INDEX, 0, 5, IGNORE_INDEX]])
    changed = logits.clone()
    changed[0, 2] = 100.0
    changed[1, 0] = -50.0
    changed[1, 3] = math.pi
    torch.testing.assert_close(token_losses(logits, labels), token_losses(changed, labels))


def test_causal_labels_shift_and_mask_padding():
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
    }
    expected = torch.tensor([[6, 7, IGNORE_INDEX, IGNORE_INDEX], [9, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]])
    assert torch.equal(causal_lm_labels(batch), expected)


def test_label_word_loss_is_a_k_way_softmax_over_the_label_tokens_computed_by_hand():
    """The classify objective: −log(e^{z_y} / Σ_k e^{z_k}) over the K label tokens' logits at the position
    before the label word, nothing else of the vocabulary; checked against plain-Python arithmetic."""
    model, _ = build_tiny_model("tiny-llama", seed=0, dtype=torch.float64)
    label_ids = torch.tensor([426, 425, 434])  # " great", " good", " film": one token each
    rows = [EncodedOption([5, 9, 17, 426], 1), EncodedOption([7, 434], 1), EncodedOption([3, 4, 5, 6, 7, 425, 12], 2)]
    batch = collate(rows, pad_token_id=0)
    positions, classes = label_word_targets(batch["labels"], label_ids)
    assert positions.tolist() == [2, 0, 4] and classes.tolist() == [0, 2, 1]
    losses = label_word_lm_losses(model, batch, label_ids).detach()
    for i, row in enumerate(rows):
        logits = model(input_ids=torch.tensor([row.input_ids])).logits[0, positions[i]].tolist()
        z = [logits[t] for t in label_ids.tolist()]
        by_hand = -(z[classes[i]] - math.log(sum(math.exp(v) for v in z)))
        assert abs(float(losses[i]) - by_hand) < 1e-12
    full_vocab = token_losses(
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
        causal_lm_labels(batch),
        "sum",
    )
    assert bool((losses < full_vocab).all())  # the vocabulary's other tokens are not in the normaliser


def test_a_row_without_a_label_word_is_refused():
    labels = torch.tensor([[IGNORE_INDEX, 5], [IGNORE_INDEX, IGNORE_INDEX]])
    with pytest.raises(ValueError, match="label word"):
        label_word_targets(labels, torch.tensor([5, 6]))
    with pytest.raises(ValueError, match="first tokens"):
        label_word_targets(torch.tensor([[IGNORE_INDEX, 7]]), torch.tensor([5, 6]))
