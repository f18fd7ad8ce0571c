"""Token-level per-sample losses: padding and ignore_index contribute nothing; sum or mean."""

from __future__ import annotations

import math

import torch

from privlm.dpsgd.losses import IGNORE_INDEX, causal_lm_labels, token_losses


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
