"""Poisson sampling (sizes, empty batches) and physical micro-batches."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from privlm.dpsgd.sampling import PoissonBatchSampler, batch_size, physical_batches, poisson_loader
from privlm.randomness import SecureRandom


def test_poisson_batch_sizes_are_binomial():
    n, q, steps = 200, 0.05, 2000
    sizes = torch.tensor(
        [len(b) for b in PoissonBatchSampler(n, q, steps, SecureRandom.from_seed(0, "sampler"))], dtype=torch.float64
    )
    mean, var = n * q, n * q * (1 - q)
    assert abs(sizes.mean() - mean) <= 3 * (var / steps) ** 0.5
    assert abs(sizes.var() - var) <= 0.15 * var


def test_each_index_included_independently_at_rate_q():
    n, q, steps = 10, 0.3, 3000
    counts = torch.zeros(n)
    for b in PoissonBatchSampler(n, q, steps, SecureRandom.from_seed(1, "sampler")):
        assert len(set(b)) == len(b)
        counts[b] += 1
    se = (q * (1 - q) / steps) ** 0.5
    assert ((counts / steps - q).abs() <= 4 * se).all()


def test_empty_batches_keep_the_structure():
    data = TensorDataset(torch.arange(12).reshape(6, 2), torch.ones(6))
    loader = poisson_loader(data, 1e-6, 3, SecureRandom.from_seed(0, "sampler"))
    batches = list(loader)
    assert len(batches) == 3
    for x, y in batches:
        assert x.shape == (0, 2) and y.shape == (0,)


def test_physical_batches_cover_the_logical_batch_in_order():
    batch = {"input_ids": torch.arange(14).reshape(7, 2), "attention_mask": torch.ones(7, 2)}
    parts = list(physical_batches(batch, 3))
    assert [batch_size(p) for p in parts] == [3, 3, 1]
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), batch["input_ids"])
    assert list(physical_batches({"input_ids": torch.zeros(0, 2)}, 3)) == []


def test_tokenizer_batch_encoding_is_split_like_a_dict():
    from privlm.resources.tiny import tiny_tokenizer

    encoded = tiny_tokenizer()(["a b c", "d", "e f"], padding=True, return_tensors="pt")  # a BatchEncoding
    assert batch_size(encoded) == 3
    parts = list(physical_batches(encoded, 2))
    assert [batch_size(p) for p in parts] == [2, 1]
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), encoded["input_ids"])


def test_unsplittable_batch_is_refused():
    import pytest

    with pytest.raises(TypeError, match="str"):
        batch_size("not a batch")


def test_every_pass_draws_new_batches():
    """Iterating the loader again (another epoch, the HF Trainer's epochs) must not replay the first
    pass's batches: draws are addressed by step, so the sampler carries its step count across passes."""
    sampler = PoissonBatchSampler(200, 0.1, 5, SecureRandom.from_seed(4, "sampler"))
    first, second = list(sampler), list(sampler)
    assert first != second and all(a != b for a, b in zip(first, second))
    again = PoissonBatchSampler(200, 0.1, 10, SecureRandom.from_seed(4, "sampler"))
    assert list(again) == first + second  # pass 2 continues the step numbers of pass 1
