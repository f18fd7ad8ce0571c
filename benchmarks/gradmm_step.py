"""One GRADMM ADMM inner step: closed-form matching loss vs autograd double backward, side by side.

    python benchmarks/gradmm_step.py --out benchmarks/results/gradmm_step.json

The step is the production x-step of :func:`privlm.synthesis.gradmm.admm.run_admm` on one batch (default
10 sequences × 32 synthetic tokens, inside the rotten-tomatoes prompt): objective, ADMM penalty,
backward to the embeddings, Adam update. Only the matching loss differs: the closed form of
:func:`privlm.synthesis.gradmm.matching.matching_loss` or the double-backward reference
:func:`privlm.synthesis.gradmm.matching.autograd_matching_loss`. The two variants alternate, after a warm-up,
so machine load affects both alike; times are medians. Peak memory is the peak of tensors allocated
during one step (weights excluded), tracked by a dispatch mode that follows every storage created
by an operator until it is freed (the technique of torch's ``MemTracker``, which needs trainable weights). The target is a random
Gaussian V × d matrix (the step's cost does not depend on its values). Writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

from privlm.resources.models import load_model  # noqa: E402
from privlm.synthesis.gradmm.generate import make_objective  # noqa: E402
from privlm.synthesis.gradmm.projection import word_like_token_ids  # noqa: E402
from privlm.synthesis.gradmm.prompt import build_prompt, head_weight  # noqa: E402

RHO, LR = 0.7, 0.008


def make_step(objective: Callable[[torch.Tensor], torch.Tensor], x0: torch.Tensor, z: torch.Tensor):
    """A closure doing one ADMM x-step (Adam on match + ρ/2‖x − z + λ/ρ‖², λ = 0) from ``x0``."""
    x = x0.clone().requires_grad_(True)
    opt = torch.optim.Adam([x], lr=LR)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        match = objective(x)
        (match + 0.5 * RHO * (x - z).pow(2).sum()).backward()
        opt.step()
        return match.item()

    return step


class PeakTensorBytes(TorchDispatchMode):
    """Tracks the bytes of tensor storages created by operators while active (freed ones subtracted).

    Outputs that share an input's storage (views such as a weight's transpose, in-place results) are
    not new memory and are not counted, so the model's weights never are.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if (
                    nbytes and key not in self._seen and key not in inputs
                ):  # views and in-place results share an input's storage
                    self._seen.add(key)
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._free, key, nbytes)
        return out


def peak_bytes(step: Callable[[], float]) -> int:
    """Peak bytes of tensors allocated while ``step`` runs (weights and inputs excluded)."""
    tracker = PeakTensorBytes()
    with tracker:
        step()
    return tracker.peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON output (a PNG is written beside it)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)
    model.requires_grad_(False)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    weight = head_weight(model)
    target = torch.randn(weight.shape, dtype=weight.dtype)
    allowed = word_like_token_ids(tokenizer, weight.shape[0])
    embedding = model.get_input_embeddings().weight.detach()
    x0 = embedding[allowed[torch.randint(len(allowed), (args.batch, args.length))]]
    z = embedding[allowed[torch.randint(len(allowed), (args.batch, args.length))]]
    label = prompt.label_token_ids[1]
    variants = {
        "closed_form": make_objective(model, prompt, label, target, closed_form=True),
        "autograd_double_backward": make_objective(model, prompt, label, target, closed_form=False),
    }
    losses = {name: float(obj(x0).detach()) for name, obj in variants.items()}
    steps = {name: make_step(obj, x0, z) for name, obj in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        step()  # warm-up
    for _ in range(args.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    peaks = {name: peak_bytes(make_step(obj, x0, z)) for name, obj in variants.items()}
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "step_time_ratio": median["autograd_double_backward"] / median["closed_form"],
        "peak_memory_ratio": peaks["autograd_double_backward"] / peaks["closed_form"],
        "median_step_s": median,
        "step_times_s": times,
        "peak_step_bytes": peaks,
        "loss_at_x0": losses,
        "config": {
            "model": args.model,
            "batch": args.batch,
            "length": args.length,
            "repeats": args.repeats,
            "prompt_tokens": len(prompt.prefix_ids) + len(prompt.suffix_ids),
            "vocab": weight.shape[0],
            "hidden": weight.shape[1],
        },
        "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(), "platform": platform.platform()},
        "note": "ratios are autograd / closed form (> 1: the closed form is faster / smaller)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    names = list(variants)
    axes[0].bar(names, [median[n] for n in names], color=["tab:green", "tab:gray"])
    axes[0].set_ylabel("median step time (s)")
    axes[0].set_title(f"time ratio {result['step_time_ratio']:.2f}×")
    axes[1].bar(names, [peaks[n] / 2**20 for n in names], color=["tab:green", "tab:gray"])
    axes[1].set_ylabel("peak step memory (MiB)")
    axes[1].set_title(f"memory ratio {result['peak_memory_ratio']:.2f}×")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"GRADMM inner step, {args.model}, batch {args.batch} × {args.length} tokens")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(json.dumps({k: result[k] for k in ("step_time_ratio", "peak_memory_ratio", "median_step_s")}, indent=2))


if __name__ == "__main__":
    main()
