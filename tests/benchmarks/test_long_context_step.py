"""Smoke test of ``benchmarks/long_context_step.py`` at tiny sizes (d = 32, T = 16): every mode runs, the JSON
has its schema, and every number is finite. In-process (``--isolate none``), one timed step: a few seconds."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "long_context_step.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("long_context_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_writes_every_mode_with_finite_numbers(bench, tmp_path):
    out = tmp_path / "long_context_step.json"
    bench.main(
        ["--shapes", "tiny", "--seq-lens", "16", "--loss-tokens", "4", "--repeats", "1", "--isolate", "none"]
        + ["--budget-s", "0", "--out", str(out)]
    )
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert {"config", "machine", "shapes", "cells", "checks"} <= set(result)
    assert {"device", "torch", "threads"} <= set(result["machine"])
    cells = {c["mode"]: c for c in result["cells"]}
    assert set(cells) == set(bench.MODES) == {"nonprivate", "ghost", "mixed", "exact", "hutchinson", "hutchpp"}
    for mode, cell in cells.items():
        assert cell["status"] == "ok", cell
        assert (cell["shape"], cell["seq_len"], cell["loss_tokens"]) == ("tiny", 16, 4)
        for key in ("step_s", "step_wall_s", "peak_memory_mb", "peak_total_mb", "step_time_ratio", "peak_total_ratio"):
            assert math.isfinite(cell[key]), (mode, key)
        assert cell["params_finite_after"]
        # the step's two parts, on its time basis: with one timed step they add up to it
        assert cell["backward_s"] > 0 and cell["update_s"] > 0
        assert math.isclose(cell["backward_s"] + cell["update_s"], cell["step_s"], rel_tol=0.05, abs_tol=1e-4)
        if mode != "nonprivate":  # privlm hooked, and got factors for, every trainable parameter
            assert cell["params_hooked"] == cell["params_with_factors"] == cell["params_trainable"] == 19
    assert cells["nonprivate"]["step_time_ratio"] == 1.0
    (check,) = result["checks"]
    assert check["best_exact_mode"] in ("exact", "ghost", "mixed")
    assert math.isfinite(check["hutchinson_step_time_ratio"])


def test_budget_skips_are_listed_with_a_reason(bench, tmp_path):
    out = tmp_path / "skipped.json"
    bench.main(
        ["--shapes", "tiny", "--seq-lens", "16,32", "--isolate", "none", "--budget-s", "1e-9", "--out", str(out)]
    )
    cells = json.loads(out.read_text())["cells"]
    assert len(cells) == 2 * len(bench.MODES)
    assert all(c["status"] == "skipped" and "budget" in c["reason"] for c in cells)
