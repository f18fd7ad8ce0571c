"""One DP-SGD step with LoRA on every decoder block vs only on the last N (``privlm train --lora-layers``).

    python benchmarks/lora_layers.py --out benchmarks/results/lora_layers.json

The step is the production private step: :class:`privlm.dpsgd.engine.PrivacyEngine` (``mixed`` norms,
book-keeping, σ = 1), micro-batches of 8, on SmolLM2-135M with LoRA rank 4 built by
:func:`privlm.training.run.with_lora` — on all 30 blocks, or on the last ``--blocks``. With adapters
on the last blocks only, autograd stops above the frozen ones, so the backward pass (and the per-sample
norms) cover a few blocks while the forward still runs through all of them. The two variants alternate
after a warm-up, one torch thread, so machine load affects both alike; times are medians and the
result is their ratio. Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from alternating import alternate  # noqa: E402  (benchmarks/alternating.py)
from torch.utils.data import DataLoader  # noqa: E402

from privlm.dpsgd.engine import PrivacyEngine  # noqa: E402
from privlm.resources.models import load_model  # noqa: E402
from privlm.training.run import with_lora  # noqa: E402


def private_step(blocks: int | None, model_name: str, batch: dict[str, torch.Tensor]):
    """A closure running one private step of a fresh LoRA model (``blocks``: None = every block)."""
    model, _ = load_model(model_name)
    module = with_lora(model, 4, seed=0, blocks=blocks)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-3)
    rows = [{k: v[i] for k, v in batch.items()} for i in range(batch["input_ids"].shape[0])]
    private, optimizer, _ = PrivacyEngine(norm_mode="mixed", seed=0).make_private(
        module,
        optimizer,
        DataLoader(rows, batch_size=len(rows)),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        max_physical_batch_size=8,
        loss_reduction="mean",
    )

    def step() -> float:
        start = time.perf_counter()
        optimizer.zero_grad()
        private.clipped_backward(batch)
        optimizer.step()
        return time.perf_counter() - start

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON output (a PNG is written beside it)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--blocks", type=int, default=2, help="LoRA on the last N blocks (the restricted variant)")
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40_000, (args.examples, args.length), generator=gen)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    variants = {
        "all blocks": private_step(None, args.model, batch),
        f"last {args.blocks} blocks": private_step(args.blocks, args.model, batch),
    }
    times, median = alternate(variants, args.repeats)
    (full, restricted) = median.values()
    result = {
        "model": args.model,
        "lora_rank": 4,
        "blocks": args.blocks,
        "examples": args.examples,
        "length": args.length,
        "norm_mode": "mixed",
        "threads": 1,
        "repeats": args.repeats,
        "machine": f"{platform.machine()}, {platform.system()}",
        "step_s": times,
        "median_step_s": median,
        "speedup": full / restricted,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(list(median), list(median.values()), color=["tab:gray", "tab:blue"])
    ax.set_ylabel("seconds per private step (median)")
    ax.set_title(f"LoRA r=4, {args.examples}×{args.length} tokens: {full / restricted:.2f}× faster")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(json.dumps({"median_step_s": median, "speedup": result["speedup"]}, indent=2))


if __name__ == "__main__":
    main()
