"""Smoke test of ``benchmarks/micro_batch_cut.py`` on the tiny model: both cuts step on the same batch, the JSON
has its schema with finite times, and the work counts are those of the two cuts (consecutive: every
micro-batch at the batch's longest row; sorted: each at its own longest, never more)."""

from __future__ import annotations

import json
import math


def test_tiny_run_counts_the_work_of_both_cuts(tmp_path, load_benchmark):
    bench = load_benchmark("micro_batch_cut")
    out = tmp_path / "cut.json"
    bench.main(
        ["--model", "tiny-llama", "--batch", "8", "--physical", "2", "--median", "20", "--p90", "40"]
        + ["--min-length", "8", "--max-length", "48", "--loss-tokens", "4", "--repeats", "1", "--out", str(out)]
    )
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert result["modes"] == ["mixed", "hutchinson"]
    for mode in result["modes"]:
        assert set(result["step_s"][mode]) == {"consecutive", "sorted"}
        assert all(math.isfinite(t) and t > 0 for t in result["step_s"][mode].values())
    lengths = bench.draw_lengths(8, 20, 40, 8, 48, seed=0)
    assert result["lengths"]["max"] == max(lengths) and len(set(lengths)) > 1
    consecutive, ordered = result["work"]["consecutive"], result["work"]["sorted"]
    assert consecutive["padded_tokens"] == 8 * max(lengths)
    widths = sorted(lengths, reverse=True)[::2]  # micro-batches of 2, longest first: each at its first row
    assert ordered["padded_tokens"] == sum(2 * w for w in widths) < consecutive["padded_tokens"]
    assert ordered["attention_area"] == sum(2 * w * w for w in widths)
