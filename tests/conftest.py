"""Shared test configuration: deterministic, offline, one intra-op thread.

Tiny models run many small tensor ops; on a 2-core machine thread synchronisation dominates them
(measured 10-14x slower with 2 threads while the other core is busy), so every test runs on one
intra-op thread and restores the previous setting afterwards.
"""

from __future__ import annotations

import os

import pytest
import torch

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
