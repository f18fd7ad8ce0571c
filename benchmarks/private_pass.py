"""Private-pass benchmark: GRADMM's per-example factors on SmolLM2, width buckets vs one full width, side by side.

Run:  .venv/bin/python benchmarks/private_pass.py [--examples 256] [--out benchmarks/results/private_pass.json]

Both layouts compute every private row in a batch of a public shape (``privlm.resources.padding``): ``full``
pads every row to the longest possible prompt (prefix + 48 text tokens + suffix, the demo preset's
``max_private_tokens``); ``buckets`` pads each row to the smallest width of the public ladder 16, 32, …
that holds it (``shape_buckets``). Same rows, same batch size (16, one filler row each), rotten-tomatoes
train split (the first ``--examples``), one torch thread, a warm-up then ``--repeats`` alternating rounds
(``benchmarks/alternating.py``). Also
checked: both layouts give the same summed factors up to float32 rounding. Writes the JSON to ``--out`` and a PNG
next to it. Compare the ratio; absolute seconds depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from alternating import alternate  # noqa: E402

from privlm.resources import padding  # noqa: E402
from privlm.resources.datasets import load_dataset  # noqa: E402
from privlm.resources.models import load_model  # noqa: E402
from privlm.synthesis.gradmm import release  # noqa: E402
from privlm.synthesis.gradmm.prompt import build_prompt  # noqa: E402

MAX_TOKENS = 48  # the demo preset's max_private_tokens


def one_width(lengths: list[int], rows: int, max_width: int) -> list[tuple[list[int], int]]:
    """``shape_buckets`` with a single width: every row padded to ``max_width``."""
    return padding.shape_buckets(lengths, rows, max_width, step=max_width)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/private_pass.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model("smollm2-135m")
    data = load_dataset("rotten-tomatoes", split="train", seed=0)
    examples = data.examples[: args.examples]
    prompt = build_prompt(tokenizer, data.verbalizer.template, list(data.verbalizer.label_words))
    layouts = {"buckets": padding.shape_buckets, "full": one_width}
    factors = {}

    def timed(name: str) -> float:
        release.shape_buckets = layouts[name]
        start = time.perf_counter()
        factors[name] = release.private_factors(model, tokenizer, examples, prompt, max_tokens=MAX_TOKENS)
        return time.perf_counter() - start

    seconds, median = alternate({name: (lambda name=name: timed(name)) for name in layouts}, args.repeats)
    release.shape_buckets = padding.shape_buckets
    gap = float((factors["buckets"].hidden.sum(0) - factors["full"].hidden.sum(0)).abs().max())  # order-free
    result = {
        "examples": len(examples),
        "max_private_tokens": MAX_TOKENS,
        "batch_rows": 16,
        "repeats": args.repeats,
        "seconds": seconds,
        "median_seconds": median,
        "full_over_buckets": median["full"] / median["buckets"],
        "max_abs_gap_of_summed_factors": gap,
        "rows_in_each": {n: len(f.labels) for n, f in factors.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(list(median), list(median.values()), color=["tab:green", "tab:gray"])
    ax.set_ylabel("seconds (median of repeats)")
    ax.set_title(f"private pass, {len(examples)} examples: full / buckets = {result['full_over_buckets']:.2f}×")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(json.dumps({k: result[k] for k in ("median_seconds", "full_over_buckets", "max_abs_gap_of_summed_factors")}))


if __name__ == "__main__":
    main()
