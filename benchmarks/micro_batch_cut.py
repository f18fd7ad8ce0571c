"""One private step of the top 2 blocks over the cached prefix: a Poisson batch cut into consecutive
micro-batches (each padded to the whole batch's longest row) vs length-sorted ones (each cut to its own
longest row), the cut every private ``privlm train`` step uses since it landed.

    python benchmarks/micro_batch_cut.py --out benchmarks/results/micro_batch_cut.json

The step: SmolLM2-135M's top 2 decoder blocks as LoRA r = 8 (``privlm.training.run.with_lora``) under
:class:`privlm.training.top_blocks.TopBlocks`, the per-sample mean token loss over each row's last ``--loss-tokens``
positions (a completion), ``PrivacyEngine(norm_mode).make_private(..., max_physical_batch_size=--physical,
micro_batches=...)``, ``clipped_backward`` then the noisy AdamW step; one torch thread. The batch: ``--batch``
rows whose lengths are drawn from a log-normal with the median and 90th percentile of ``--median``/``--p90``
(the bbc-headlines training prompts: 433 and 793 tokens), capped at ``--max-length``, with random hidden
states (d = 576, bfloat16, as the cache keeps them). Both cuts step on the same batch, same weights (reset
before every step) and the same seeded noise; the cuts alternate after a warm-up, so machine load affects
them alike; the time is the median of process CPU seconds per step. Also counted: the padded tokens and
the attention area (Σ width²) each cut computes. Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from alternating import alternate  # noqa: E402  (benchmarks/alternating.py)

from privlm.dpsgd.engine import PrivacyEngine  # noqa: E402
from privlm.dpsgd.sampling import physical_batches  # noqa: E402
from privlm.resources.models import load_model  # noqa: E402
from privlm.training.run import with_lora  # noqa: E402
from privlm.training.top_blocks import (  # noqa: E402
    PrefixRow,
    TopBlocks,
    collate_prefix,
    length_sorted_batches,
    top_token_losses,
)

CUTS = {"consecutive": physical_batches, "sorted": length_sorted_batches}


def draw_lengths(n: int, median: float, p90: float, floor: int, cap: int, seed: int) -> list[int]:
    """``n`` lengths from the log-normal with this median and 90th percentile, in [floor, cap]."""
    sigma = math.log(p90 / median) / 1.2815515655446004  # the standard normal's 90th percentile
    draws = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return [int(min(cap, max(floor, round(median * math.exp(sigma * float(z)))))) for z in draws]


def make_rows(lengths: list[int], d: int, vocab: int, loss_tokens: int, seed: int) -> list[PrefixRow]:
    """Cached rows of these lengths: random states, loss at the last ``loss_tokens`` positions."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        positions = torch.arange(n - loss_tokens, n)
        targets = torch.randint(vocab, (loss_tokens,), generator=gen)
        rows.append(PrefixRow(torch.randn(n, d, generator=gen).to(torch.bfloat16), positions, targets))
    return rows


def work(batch: dict[str, torch.Tensor], cut: Callable, physical: int) -> dict[str, int]:
    """Padded tokens and attention area (Σ over micro-batches of rows × width²) of a cut."""
    tokens = area = 0
    for micro in cut(batch, physical):
        rows, width = micro["attention_mask"].shape
        tokens, area = tokens + rows * width, area + rows * width * width
    return {"padded_tokens": tokens, "attention_area": area}


def step_runner(model, mode: str, cut: Callable, batch, args) -> Callable[[], float]:
    """A closure running one private step from the same initial weights; it returns its CPU seconds."""
    module = copy.deepcopy(model)
    top = TopBlocks(module, 2)
    initial = {k: v.clone() for k, v in top.state_dict().items()}
    params = [p for p in top.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-3)
    loader = torch.utils.data.DataLoader(list(range(args.batch * 4)), batch_size=args.batch)  # q = 1/4
    private, dp_optimizer, _ = PrivacyEngine(mode, probes=32, seed=0).make_private(
        top,
        optimizer,
        loader,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        max_physical_batch_size=args.physical,
        loss_fn=top_token_losses,
        micro_batches=cut,
    )

    def run() -> float:
        top.load_state_dict(initial)
        start = time.process_time()
        private.clipped_backward(batch)
        dp_optimizer.step()
        dp_optimizer.zero_grad()
        return time.process_time() - start

    return run


def plot(result: dict, path: Path) -> None:
    modes = result["modes"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.35
    for i, cut in enumerate(CUTS):
        ax.bar(
            [m + (i - 0.5) * width for m in range(len(modes))],
            [result["step_s"][mode][cut] for mode in modes],
            width,
            label=cut,
        )
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylabel("CPU s per private step")
    ratios = ", ".join(f"{m} {result['sorted_over_consecutive'][m]:.2f}x" for m in modes)
    ax.set_title(
        f"B = {result['batch']}, micro-batches of {result['physical']}: sorted / consecutive {ratios}", fontsize=9
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--physical", type=int, default=8)
    parser.add_argument("--median", type=float, default=433)
    parser.add_argument("--p90", type=float, default=793)
    parser.add_argument("--min-length", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--model", default="smollm2-135m", help="a registered model (tiny-llama for a smoke run)")
    parser.add_argument("--loss-tokens", type=int, default=16)
    parser.add_argument("--modes", default="mixed,hutchinson")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/micro_batch_cut.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    base, _ = load_model(args.model)
    model = with_lora(base, 8, seed=0, blocks=2)
    lengths = draw_lengths(args.batch, args.median, args.p90, args.min_length, args.max_length, seed=0)
    batch = collate_prefix(
        make_rows(lengths, base.config.hidden_size, base.config.vocab_size, args.loss_tokens, seed=1)
    )
    modes = args.modes.split(",")
    step_s, times = {}, {}
    for mode in modes:
        runners = {cut: step_runner(model, mode, fn, batch, args) for cut, fn in CUTS.items()}
        times[mode], step_s[mode] = alternate(runners, args.repeats)
    counts = {cut: work(batch, fn, args.physical) for cut, fn in CUTS.items()}
    result = {
        "benchmark": "micro_batch_cut",
        "batch": args.batch,
        "physical": args.physical,
        "model": args.model,
        "loss_tokens": args.loss_tokens,
        "lengths": {
            "median": sorted(lengths)[len(lengths) // 2],
            "max": max(lengths),
            "mean": sum(lengths) / len(lengths),
        },
        "modes": modes,
        "repeats": args.repeats,
        "step_s": step_s,
        "step_s_all": times,
        "sorted_over_consecutive": {m: step_s[m]["sorted"] / step_s[m]["consecutive"] for m in modes},
        "work": counts,
        "work_ratio": {k: counts["sorted"][k] / counts["consecutive"][k] for k in counts["sorted"]},
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": 1},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("sorted_over_consecutive", "work_ratio", "step_s")}, indent=2))
    return result


if __name__ == "__main__":
    main()
