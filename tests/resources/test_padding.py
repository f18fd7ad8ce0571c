"""Fixed-shape private batches: a row's features are a function of that row alone (bitwise), for PE's
embeddings and GRADMM's private factors — adding one example leaves every other example's output unchanged.

On the tiny models both fixed and length-batched padding happen to be bitwise stable, so the tiny-model
tests check the fixed-shape path itself (rows aligned, filler rows dropped, order kept); only the slow
SmolLM2 test, where length-batched padding measurably moves other rows, catches a return to it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privlm.lm.features import hidden_features
from privlm.resources.padding import padded_batch, shape_buckets
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.gradmm.release import private_factors

TEXTS = [f"review {i}: " + "very " * (i % 7) + ("good" if i % 2 else "bad") + " film" * (i % 3) for i in range(37)]
INSERTED = "an added example, long enough to move the batch boundaries " * 2


def test_padded_batch_shapes_fillers_and_refusals() -> None:
    ids, mask, lengths = padded_batch([[5, 6], [7]], 0, width=4, rows=3)
    assert ids.tolist() == [[5, 6, 0, 0], [7, 0, 0, 0], [0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    assert lengths.tolist() == [2, 1]
    with pytest.raises(ValueError, match="exceed"):
        padded_batch([[1, 2, 3]], width=2)
    with pytest.raises(ValueError, match="exceed"):
        padded_batch([[1], [2]], rows=1)


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny-llama", seed=4)
    return model.eval(), tokenizer


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_pe_embeddings_do_not_depend_on_the_other_examples(lm, pooling: str) -> None:
    model, tokenizer = lm
    before = hidden_features(model, tokenizer, TEXTS, pooling, batch_size=8, max_length=24, fixed_shape=True)
    after = hidden_features(
        model, tokenizer, [INSERTED, *TEXTS], pooling, batch_size=8, max_length=24, fixed_shape=True
    )
    assert np.array_equal(after[1:], before)  # bitwise: every batch boundary moved, no row changed


def test_gradmm_private_factors_do_not_depend_on_the_other_examples(lm) -> None:
    model, tokenizer = lm
    prompt = build_prompt(tokenizer, "{text} It was ", ["bad", "great"])
    examples = [(t, i % 2) for i, t in enumerate(TEXTS)]
    rows = lambda f: {(bytes(h.numpy().tobytes()), int(k)) for h, k in zip(f.hidden, f.labels)}  # noqa: E731
    with torch.no_grad():
        before = private_factors(model, tokenizer, examples, prompt, max_tokens=16, batch_size=8)
        after = private_factors(model, tokenizer, [(INSERTED, 1), *examples], prompt, max_tokens=16, batch_size=8)
    assert len(rows(before)) == len(TEXTS) and rows(before) <= rows(after)


@pytest.mark.slow
def test_on_smollm2_fixed_shapes_keep_every_other_embedding_bitwise() -> None:
    """On SmolLM2 length-batched padding does move other examples' embeddings (measured on these texts:
    6 of 48 changed, by up to 1.9e-6, when one example was added in front); fixed shapes must move none.
    (On the tiny models above both ways happen to be bitwise stable, so only this test can catch a
    return to length-batched padding.)"""
    from privlm.resources.models import load_model

    model, tokenizer = load_model("smollm2-135m")
    rng = np.random.default_rng(1)
    words = "the film is a warm funny moving dull slow long story cast plot acting wooden smart sharp".split()
    texts = [" ".join(rng.choice(words, int(rng.integers(3, 30)))) for _ in range(48)]
    before = hidden_features(model, tokenizer, texts, "mean", max_length=64, fixed_shape=True)
    after = hidden_features(model, tokenizer, [INSERTED * 2, *texts], "mean", max_length=64, fixed_shape=True)
    assert np.array_equal(after[1:], before)


def test_shape_buckets_place_each_row_by_its_own_length() -> None:
    lengths = [3, 17, 16, 40, 1, 33, 16]
    batches = shape_buckets(lengths, rows=3, max_width=45, step=16)
    assert sorted(i for indices, _ in batches for i in indices) == list(range(len(lengths)))
    assert all(len(indices) <= 2 for indices, _ in batches)  # rows - 1: every batch keeps a filler row
    assert {i: w for indices, w in batches for i in indices} == {0: 16, 2: 16, 4: 16, 6: 16, 1: 32, 3: 45, 5: 45}
    with pytest.raises(ValueError, match="exceeds"):
        shape_buckets([46], rows=2, max_width=45)
    with pytest.raises(ValueError, match="rows must be >= 2"):
        shape_buckets([4], rows=1, max_width=45)


def test_bucketed_rows_keep_the_order_of_their_texts(lm) -> None:
    """The bucketed pass returns row i for text i (not in bucket order)."""
    model, tokenizer = lm
    texts = [TEXTS[0] + " word" * 20, TEXTS[1], TEXTS[2] + " more" * 9]
    together = hidden_features(model, tokenizer, texts, "last", batch_size=4, max_length=40, fixed_shape=True)
    alone = np.concatenate(
        [hidden_features(model, tokenizer, [t], "last", batch_size=4, max_length=40, fixed_shape=True) for t in texts]
    )
    assert np.array_equal(together, alone)
