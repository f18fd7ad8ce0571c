"""One private epoch with the frozen model's features cached vs computed every step, and vs the LoRA path.

    python benchmarks/prefix_cache.py --out benchmarks/results/prefix_cache.json

Three ways to train a classifier privately on the same BBC News articles (``--examples`` of the train
split, T = ``--length``, SmolLM2-135M, ``mixed`` norms, σ = 1, expected batch N/4 so an epoch is 4
Poisson steps, micro-batches of 8, one torch thread), each one epoch of :func:`privlm.training.loop.train_loop`:

- ``lora-top2``: LoRA r = 4 on the last 2 decoder blocks, label-word objective (the path of
  ``research/dp_finetune_bbc_lora``, before this change);
- ``head uncached``: the label-word head, features recomputed through the frozen model every step;
- ``head cached``: the label-word head on features computed once (:mod:`privlm.training.prefix_cache`).

The one-off cost of building the cache (a forward pass per example) is timed too. The variants and the
build alternate after a warm-up, so machine load affects them alike; times are medians; the result is the
ratio per epoch and the number of epochs after which the cache has paid for itself. Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from alternating import alternate  # noqa: E402  (benchmarks/alternating.py)

from privlm.dpsgd.losses import label_word_lm_losses  # noqa: E402
from privlm.lm.prompts import pad_token_id  # noqa: E402
from privlm.resources.models import load_model  # noqa: E402
from privlm.training.data import encode, load_task_data, make_collate  # noqa: E402
from privlm.training.head import LabelWordHead, head_losses, label_token_ids  # noqa: E402
from privlm.training.loop import TrainConfig, prepare, train_loop  # noqa: E402
from privlm.training.prefix_cache import cached_rows, collate_cached, compute_features  # noqa: E402
from privlm.training.run import with_lora  # noqa: E402


def epoch_runner(
    variant: str, args: argparse.Namespace, data, rows, classes
) -> tuple[Callable[[], float], Callable[[], float]]:
    """A closure training one private epoch of a fresh model in ``variant`` (it returns its wall time), and
    one building the variant's feature cache (it returns its wall time; 0 without a cache)."""
    model, tokenizer = load_model(args.model)
    ids = label_token_ids(tokenizer, data.verbalizer)
    collate = make_collate(tokenizer)
    config = TrainConfig(
        noise_multiplier=1.0,
        batch_size=max(1, len(rows) // 4),
        epochs=1,
        seed=0,
        physical_batch_size=8,
        log_every=1000,
        head_only=variant != "lora-top2",
        lora=4 if variant == "lora-top2" else 0,
        lora_layers=2 if variant == "lora-top2" else None,
    )
    if variant == "lora-top2":
        module = with_lora(model, 4, seed=0, blocks=2)
        loss_fn = functools.partial(label_word_lm_losses, label_ids=torch.tensor(ids))
    else:
        module, loss_fn = LabelWordHead(model, ids), head_losses
    token_rows = rows

    def build() -> float:
        start = time.perf_counter()
        compute_features(module, token_rows, pad_token_id(tokenizer), args.length).to(torch.bfloat16)
        return time.perf_counter() - start

    if variant == "head cached":
        features = compute_features(module, rows, pad_token_id(tokenizer), args.length).to(torch.bfloat16)
        rows, collate = cached_rows(features, classes), collate_cached

    def epoch() -> float:
        run = prepare(module, rows, collate, config, loss_fn=loss_fn)
        start = time.perf_counter()
        train_loop(run)
        return time.perf_counter() - start

    return epoch, build if variant == "head cached" else (lambda: 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON output (a PNG is written beside it)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_task_data("bbc-news", "classify")
    _, tokenizer = load_model(args.model)
    train = data.train[: args.examples]
    rows = encode(type(data)(data.task, train, (), data.verbalizer), tokenizer, args.length)
    classes = [y for _, y in train]
    runners = {
        name: epoch_runner(name, args, data, rows, classes) for name in ("lora-top2", "head uncached", "head cached")
    }
    variants = {name: epoch for name, (epoch, _) in runners.items()}
    variants["cache build (once)"] = runners["head cached"][1]
    times, median = alternate(variants, args.repeats)
    cached, build_s = median["head cached"], median["cache build (once)"]
    result = {
        "model": args.model,
        "examples": args.examples,
        "length": args.length,
        "tokens": sum(len(r.input_ids) for r in rows),
        "norm_mode": "mixed",
        "threads": 1,
        "repeats": args.repeats,
        "machine": f"{platform.machine()}, {platform.system()}",
        "epoch_s": times,
        "median_epoch_s": median,
        "cache_build_s": build_s,
        "ratio_uncached_per_cached_epoch": median["head uncached"] / cached,
        "ratio_lora_top2_per_cached_epoch": median["lora-top2"] / cached,
        "epochs_to_pay_back_the_cache_vs_uncached": build_s / (median["head uncached"] - cached),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(list(median), list(median.values()), color=["tab:gray", "tab:orange", "tab:blue", "tab:green"])
    ax.set_yscale("log")
    ax.set_ylabel("seconds (median)")
    ax.set_title(
        f"one private epoch, {args.examples}×≤{args.length} tokens: cached "
        f"{result['ratio_uncached_per_cached_epoch']:.0f}× faster than uncached",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(json.dumps({k: v for k, v in result.items() if k != "epoch_s"}, indent=2))


if __name__ == "__main__":
    main()
