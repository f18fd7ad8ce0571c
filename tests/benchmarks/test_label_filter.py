"""Smoke test of ``benchmarks/label_filter.py`` on the tiny model: both passes run, the JSON has its schema, and the
shared-prefix scores are the whole-prompt ones (the labels agree)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "label_filter.py"


def test_tiny_run_compares_both_passes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # its sibling benchmarks/alternating.py, as when run as a script
    spec = importlib.util.spec_from_file_location("label_filter", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "filter.json"
    bench.main(["--model", "tiny-llama", "--texts", "20", "--repeats", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert set(result["pass_s"]) == {"whole_prompt", "shared_prefix"}
    assert all(math.isfinite(t) and t > 0 for t in result["pass_s"].values())
    assert result["texts"] == 20 and result["prefix_tokens"] > result["mean_text_tokens"] > 0
    assert result["max_score_difference"] < 1e-4 and result["labels_agree"]
