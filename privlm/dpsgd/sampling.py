"""Poisson sampling and physical micro-batches.

Under Poisson sampling every example joins each logical batch independently with probability q, so
batch sizes vary and may be zero; the privacy accounting of subsampled Gaussian steps assumes exactly
this. Inclusion is decided by 53-bit uniforms from a :class:`~privlm.randomness.SecureRandom` stream,
the draw for step t at address (t,): which examples a step used is as secret as the key, and a resumed
run (or every rank) draws the same batches. A logical batch larger than memory is cut into physical micro-batches whose clipped sums are
accumulated before the noise is added (once per logical step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.dataloader import default_collate

from privlm.randomness import SecureRandom


class PoissonBatchSampler(Sampler[list[int]]):
    """``steps`` batches per pass, indices in ``range(num_samples)``, each included independently with
    probability ``sample_rate``. The first pass draws the batches of steps ``first_step …``; every further
    pass (a loader iterated again: another epoch) continues with the next step numbers, so no batch is
    ever drawn twice — a repeated batch would repeat its examples' contributions outside the accounting."""

    def __init__(
        self, num_samples: int, sample_rate: float, steps: int, randomness: SecureRandom, first_step: int = 1
    ) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self.num_samples = num_samples
        self.sample_rate = sample_rate
        self.steps = steps
        self.randomness = randomness
        self.next_step = first_step

    def __iter__(self) -> Iterator[list[int]]:
        first = self.next_step
        self.next_step += self.steps  # claimed at once: two live iterators never share a step
        for step in range(first, first + self.steps):
            keep = self.randomness.uniform(self.num_samples, (step,)) < self.sample_rate
            yield keep.nonzero().flatten().tolist()

    def __len__(self) -> int:
        return self.steps


def take_rows(batch: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` (dim 0) of a batch: a tensor, or a dict / list / tuple of them."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, Mapping):  # dict, or a tokenizer's BatchEncoding
        return {k: take_rows(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(take_rows(v, start, stop) for v in batch)
    raise TypeError(f"cannot split a batch of type {type(batch).__name__}")


def batch_size(batch: Any) -> int:
    """Number of rows (dim 0) of a batch (the first tensor found)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, (Mapping, list, tuple)):
        for value in batch.values() if isinstance(batch, Mapping) else batch:
            return batch_size(value)
    raise TypeError(f"cannot find the rows of a batch of type {type(batch).__name__}")


MicroBatches = Callable[[Any, int | None], Iterable[Any]]
"""How a logical batch is cut into micro-batches of at most ``max_size`` rows (None: no cap). Any cut that
holds every row exactly once gives the same clipped sum: each row's clipped gradient is its own."""


def longest_first(lengths: torch.Tensor, max_size: int | None) -> Iterator[torch.Tensor]:
    """The row indices of micro-batches of at most ``max_size`` rows (None: one), rows sorted by ``lengths``
    (B,), longest first (stable: equal lengths keep their order); the cut of the length-sorted micro-batches
    (e.g. :func:`privlm.training.data.length_sorted_token_batches`)."""
    order = torch.argsort(lengths, descending=True, stable=True)
    step = max(len(order) if max_size is None else max_size, 1)
    for start in range(0, len(order), step):
        yield order[start : start + step]


def physical_batches(batch: Any, max_size: int | None) -> Iterator[Any]:
    """Split a logical batch into consecutive micro-batches of at most ``max_size`` rows (none if empty)."""
    n = batch_size(batch)
    step = n if max_size is None else max_size
    for start in range(0, n, max(step, 1)):
        yield take_rows(batch, start, min(start + step, n))


class _EmptySafeCollate:
    """Collate; an empty index list gives the first example's batch with 0 rows (same structure)."""

    def __init__(self, collate: Callable[[list[Any]], Any], dataset: Dataset[Any]) -> None:
        self.collate = collate
        self.dataset = dataset

    def __call__(self, examples: Sequence[Any]) -> Any:
        if len(examples) == 0:
            return take_rows(self.collate([self.dataset[0]]), 0, 0)
        return self.collate(list(examples))


def poisson_loader(
    dataset: Dataset[Any],
    sample_rate: float,
    steps: int,
    randomness: SecureRandom,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    num_workers: int = 0,
) -> DataLoader[Any]:
    """A DataLoader yielding ``steps`` Poisson-sampled logical batches (possibly empty) of ``dataset``."""
    if not isinstance(dataset, Sized):
        raise TypeError(f"Poisson sampling needs a dataset with a length, got a {type(dataset).__name__}")
    sampler = PoissonBatchSampler(len(dataset), sample_rate, steps, randomness)
    collate = _EmptySafeCollate(collate_fn or default_collate, dataset)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers)
