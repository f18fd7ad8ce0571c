"""The secure noise stream against torch's generator: cost per private step and the Gaussian's tails.

1. Cost: one step's noise for SmolLM2-135M's trainable parameters — full fine-tuning (134.5M) and LoRA
   r = 8 on every linear layer (the adapter sizes are counted from the model's shapes) — drawn by
   :class:`privlm.randomness.SecureRandom` (ChaCha20 + float64 Box–Muller, cast to float32) and by
   ``torch.randn`` from a ``torch.Generator`` (float32, what privlm used before the audit), medians of
   ``--repeats`` draws in the same process (process CPU seconds; ratios, not absolute times, are the
   result on a shared machine). In-step: a private Hutchinson step (k = 32, book-keeping) of the
   SmolLM2-shaped 3-layer model of ``benchmarks/norms.py`` at T = 2048, full fine-tuning, with the secure
   stream and with torch's generator (probes and noise), *alternating* step by step so that drift of a
   shared machine hits both alike (``benchmarks/norms.py --modes hutchinson hutchinson-torch-rng``
   measures the same pair one mode after the other).
2. Tails: ``--draws`` (default 10⁸) standard normals from the secure stream in float64: counts beyond
   3σ, 4σ, 5σ and 6σ against the normal law (expected count, and the z-score of the observed count), the
   largest |z|, and the same for ``torch.randn`` in float32 (whose 24-bit uniforms cannot pass ≈ 5.8σ).

    python benchmarks/secure_noise.py --out benchmarks/results/secure_noise.json   # also writes .png
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from norms import TorchRandom, _batch, smollm2_shaped  # noqa: E402  (benchmarks/norms.py)
from scipy import stats  # noqa: E402

from privlm.atomic import atomic_path, write_text_atomic  # noqa: E402
from privlm.dpsgd.clipping import PerSampleClipper  # noqa: E402
from privlm.dpsgd.losses import causal_lm_losses  # noqa: E402
from privlm.dpsgd.optimizer import DPOptimizer  # noqa: E402
from privlm.randomness import SecureRandom  # noqa: E402

# SmolLM2-135M: vocab 49,152, d = 576, 30 blocks, MLP 1,536, 9 query / 3 key-value heads of 64, tied head.
VOCAB, D, LAYERS, MLP, KV = 49152, 576, 30, 1536, 192
LINEARS = [(D, D), (D, KV), (D, KV), (D, D), (D, MLP), (D, MLP), (MLP, D)]  # (in, out) per block
FULL = VOCAB * D + LAYERS * (sum(i * o for i, o in LINEARS) + 2 * D) + D
LORA_R8 = LAYERS * sum(8 * (i + o) for i, o in LINEARS)
THRESHOLDS = (3.0, 4.0, 5.0, 6.0)
CHUNK = 10_000_000


def _cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def draw_cost(n: int, repeats: int) -> dict:
    """Median CPU seconds to draw ``n`` float32 normals, secure vs torch, interleaved."""
    secure, torch_rng = SecureRandom.from_os(), torch.Generator().manual_seed(0)
    times = {"secure": [], "torch": []}
    for step in range(1, repeats + 1):
        times["secure"].append(_cpu_seconds(lambda step=step: secure.normal((n,), (step, 0))))
        times["torch"].append(_cpu_seconds(lambda: torch.randn(n, generator=torch_rng)))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "params": n,
        "secure_s": med["secure"],
        "torch_s": med["torch"],
        "ratio": med["secure"] / med["torch"],
        "extra_s": med["secure"] - med["torch"],
    }


def in_step(seq_len: int, steps: int, layers: int = 3) -> dict:
    """Median CPU seconds of a private Hutchinson step with either generator, steps interleaved."""
    batch = _batch(seq_len, 1)
    runners = {}
    for name, make in (("secure", lambda s: SecureRandom.from_seed(s, "benchmark")), ("torch", TorchRandom)):
        model = smollm2_shaped(layers, tied=True)
        clipper = PerSampleClipper(
            model, causal_lm_losses, max_grad_norm=1.0, norm_mode="hutchinson", probes=32, randomness=make(1)
        )
        opt = DPOptimizer(
            torch.optim.Adam(model.parameters(), lr=1e-5),
            clipper,
            noise_multiplier=1.0,
            expected_batch_size=1.0,
            randomness=make(2),
        )
        runners[name] = (clipper, opt)
    times = {name: [] for name in runners}
    for index in range(steps + 1):
        for name, (clipper, opt) in runners.items():

            def step(opt: DPOptimizer = opt, clipper: PerSampleClipper = clipper) -> None:
                opt.zero_grad()
                clipper.clipped_backward(batch)
                opt.step()

            seconds = _cpu_seconds(step)
            if index:  # the first round warms up
                times[name].append(seconds)
    med = {name: statistics.median(v) for name, v in times.items()}
    return {
        "seq_len": seq_len,
        "layers": layers,
        "params": sum(p.numel() for p in runners["secure"][0].params),
        "steps": steps,
        "secure_s": med["secure"],
        "torch_s": med["torch"],
        "ratio": med["secure"] / med["torch"],
        "secure_all_s": times["secure"],
        "torch_all_s": times["torch"],
    }


def tail_counts(draws: int, source: str) -> dict:
    """Counts of |z| beyond each threshold over ``draws`` normals, with the normal law's expectation."""
    secure, torch_rng = SecureRandom.from_os(), torch.Generator().manual_seed(0)
    counts = {t: 0 for t in THRESHOLDS}
    largest = 0.0
    sum_sq = 0.0
    for index, start in enumerate(range(0, draws, CHUNK)):
        n = min(CHUNK, draws - start)
        z = (
            secure.normal((n,), (index,), dtype=torch.float64)
            if source == "secure"
            else torch.randn(n, generator=torch_rng)
        )
        a = z.abs()
        largest = max(largest, float(a.max()))
        sum_sq += float(z.double().pow(2).sum())
        for t in THRESHOLDS:
            counts[t] += int((a > t).sum())
    rows = []
    for t in THRESHOLDS:
        expected = draws * 2 * stats.norm.sf(t)
        rows.append(
            {
                "threshold": t,
                "observed": counts[t],
                "expected": expected,
                "z_score": (counts[t] - expected) / math.sqrt(expected),
            }
        )
    return {
        "source": source,
        "draws": draws,
        "dtype": "float64" if source == "secure" else "float32",
        "variance": sum_sq / draws,
        "max_abs": largest,
        "tails": rows,
    }


def plot(result: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    costs = result["cost"]
    names = list(costs)
    x = range(len(names))
    axes[0].bar([i - 0.2 for i in x], [costs[n]["torch_s"] for n in names], 0.4, label="torch.randn (before)")
    axes[0].bar([i + 0.2 for i in x], [costs[n]["secure_s"] for n in names], 0.4, label="SecureRandom")
    axes[0].set_xticks(list(x), [f"{n}\n{costs[n]['params'] / 1e6:.1f}M params" for n in names])
    axes[0].set_ylabel("CPU s per step's noise")
    axes[0].set_yscale("log")
    axes[0].legend()
    step = result["in_step"]
    axes[0].set_title(
        f"Noise of one private step (SmolLM2-135M)\nwhole Hutchinson step, T={step['seq_len']}, "
        f"{step['params'] / 1e6:.0f}M params: secure / torch = {step['ratio']:.3f}",
        fontsize=9,
    )
    for tails, marker in ((result["tails_secure"], "o"), (result["tails_torch"], "x")):
        t = [r["threshold"] for r in tails["tails"]]
        axes[1].plot(
            t,
            [max(r["observed"], 0.5) for r in tails["tails"]],
            marker=marker,
            ls="",
            label=f"{tails['source']} ({tails['dtype']}) observed",
        )
    expected = result["tails_secure"]["tails"]
    axes[1].plot(
        [r["threshold"] for r in expected], [r["expected"] for r in expected], color="grey", label="normal law"
    )
    axes[1].set_yscale("log")
    axes[1].set_xlabel("|z| threshold")
    axes[1].set_ylabel(f"count beyond, of {result['tails_secure']['draws']:.0e} draws (0 drawn at 0.5)")
    axes[1].legend(fontsize=8)
    axes[1].set_title("Tails")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON output (PNG written next to it)")
    parser.add_argument("--draws", type=int, default=100_000_000, help="normals for the tail counts")
    parser.add_argument("--repeats", type=int, default=5, help="timed draws per generator and size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=2048, help="T of the in-step comparison")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per generator in the in-step comparison")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cost = {"full": draw_cost(FULL, args.repeats), "lora-r8": draw_cost(LORA_R8, args.repeats)}
    print(json.dumps(cost), flush=True)
    step = in_step(args.seq_len, args.steps)
    print(json.dumps({k: v for k, v in step.items() if not k.endswith("_all_s")}), flush=True)
    result = {
        "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": "cpu"},
        "cost": cost,
        "in_step": step,
        "tails_secure": tail_counts(args.draws, "secure"),
        "tails_torch": tail_counts(args.draws, "torch"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1))
    plot(result, args.out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("tails_secure", "tails_torch")}, indent=1))


if __name__ == "__main__":
    main()
