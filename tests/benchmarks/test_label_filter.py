"""Smoke test of ``benchmarks/label_filter.py`` on the tiny model: both passes run, the JSON has its schema, and the
shared-prefix scores are the whole-prompt ones (the labels agree)."""

from __future__ import annotations

import json
import math


def test_tiny_run_compares_both_passes(tmp_path, load_benchmark):
    bench = load_benchmark("label_filter")
    out = tmp_path / "filter.json"
    bench.main(["--model", "tiny-llama", "--texts", "20", "--repeats", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert set(result["pass_s"]) == {"whole_prompt", "shared_prefix"}
    assert all(math.isfinite(t) and t > 0 for t in result["pass_s"].values())
    assert result["texts"] == 20 and result["prefix_tokens"] > result["mean_text_tokens"] > 0
    assert result["max_score_difference"] < 1e-4 and result["labels_agree"]
