"""Make the shared DP-SGD test harness (``dpsgd_harness.py``) importable under ``--import-mode=importlib``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _single_thread():
    """These tests run many tiny tensor ops; on a shared 2-core machine thread synchronisation dominates."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
