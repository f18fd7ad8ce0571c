"""Smoke test of ``benchmarks/sampling.py`` on the tiny model: the three variants run on both workloads, the
JSON has its schema, and all three give the same texts."""

from __future__ import annotations

import json
import math


def test_tiny_run_compares_the_three_variants_and_checks_the_filter(tmp_path, load_benchmark):
    bench = load_benchmark("sampling")
    out = tmp_path / "sampling.json"
    bench.main(
        [
            "--model",
            "tiny-llama",
            "--prompts",
            "4",
            "--samples",
            "6",
            "--max-new-tokens",
            "6",
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert set(result["workloads"]) == {"pe_rewrites", "zero_shot"}
    for workload in result["workloads"].values():
        assert set(workload["call_s"]) == {"every_copy", "full_sort", "topk_nucleus"}
        assert all(math.isfinite(t) and t > 0 for t in workload["call_s"].values())
        assert workload["same_texts"] is True
        check = workload["filter_check"]
        assert check["rows"] > 0 and check["rows_differing"] == 0 and check["rows_to_warper"] < check["rows"]
    assert (
        result["workloads"]["pe_rewrites"]["prompts"] == 4
        and result["workloads"]["zero_shot"]["samples_per_prompt"] == 6
    )
