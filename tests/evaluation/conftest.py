"""One intra-op thread per test: the tiny models run ~10x faster than with threads contending on a
shared 2-core machine. The previous setting is restored after each test."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
