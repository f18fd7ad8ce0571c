"""Shared test configuration: deterministic, offline, one intra-op thread.

Tiny models run many small tensor ops; on a 2-core machine thread synchronisation dominates them
(measured 10-14x slower with 2 threads while the other core is busy), so every test runs on one
intra-op thread and restores the previous setting afterwards.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from privlm.randomness import SecureRandom

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def single_thread():
    """Run the test on one torch intra-op thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def seeded_os_keys(monkeypatch):
    """The mechanisms' noise keys come from the OS; here the k-th key drawn is the seeded stream k, so that
    the tests are deterministic (and successive draws, e.g. PE's T histograms, stay independent)."""
    counter = itertools.count()
    monkeypatch.setattr(
        SecureRandom, "from_os", classmethod(lambda cls: SecureRandom.from_seed(next(counter), "audit-test"))
    )
