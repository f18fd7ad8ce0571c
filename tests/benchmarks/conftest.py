"""Load a benchmark script (``benchmarks/<name>.py``) as a module, as it runs: its folder on ``sys.path``, so its
sibling helpers (``benchmarks/alternating.py``) import."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def load_benchmark(monkeypatch: pytest.MonkeyPatch):
    """``load_benchmark(name)``: the module of ``benchmarks/<name>.py``."""

    def load(name: str) -> ModuleType:
        monkeypatch.syspath_prepend(str(BENCHMARKS))
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
