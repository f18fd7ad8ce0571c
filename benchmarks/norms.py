"""Per-sample norm modes against non-private training and Opacus ghost clipping, side by side.

Model: a randomly initialised SmolLM2-shaped ``LlamaForCausalLM`` (d=576, vocab 49,152, 9 heads / 3 KV
heads, MLP 1536, tied embeddings, a few layers), full fine-tuning with Adam, one sequence per step.
For every context length T it times one optimizer step of each mode in the same process and reports
ratios against the non-private step measured in the same run:

- ``step_time_ratio``: median step time / non-private median step time, in process CPU seconds (wall
  seconds are in the rows too, but on a shared machine they mostly measure the other processes);
- ``peak_memory_ratio``: peak resident memory above the idle process during the mode's steps (model,
  optimizer, activations, norms; the Linux high-water mark, reset before each mode) / the same for
  non-private training;
- ``norm_memory_mb``: peak bytes of tensors alive at once that the per-sample norm computation itself
  allocated (counted with a torch dispatch mode on an extra, untimed step).

Opacus 1.6 refuses tied parameters under ghost clipping, so ``opacus-ghost`` runs on the same model with
untied embeddings and its ratios are against a non-private run of that untied model (``nonprivate-untied``).
Speed is only ever compared within one run (the machine may be shared).

    python benchmarks/norms.py [--quick] --out benchmarks/results/norms.json   # also writes norms.png
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import os
import statistics
import time
import warnings
import weakref
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from privlm.dpsgd.clipping import PerSampleClipper  # noqa: E402
from privlm.dpsgd.losses import causal_lm_losses  # noqa: E402
from privlm.dpsgd.optimizer import DPOptimizer  # noqa: E402
from privlm.randomness import SecureRandom  # noqa: E402

FULL_T = (256, 512, 1024, 2048, 4096)
QUICK_T = (256,)
QUICK_MODES = ("exact", "mixed", "hutchinson", "hutchpp")  # --quick: the engine's bar, < 1 min on 2 busy cores
PRIVATE_MODES = {  # name: (norm_mode, probes, bookkeeping, randomness)
    "exact": ("exact", 32, True, "secure"),
    "ghost": ("ghost", 32, True, "secure"),
    "mixed": ("mixed", 32, True, "secure"),
    "hutchinson": ("hutchinson", 32, True, "secure"),
    "hutchinson-torch-rng": ("hutchinson", 32, True, "torch"),
    "hutchinson-2nd-backward": ("hutchinson", 32, False, "secure"),
    "hutchpp": ("hutchpp", 32, True, "secure"),
}


class TorchRandom:
    """The generator privlm used before the audit (``torch.randn`` from a ``torch.Generator``, float32,
    32 bits of seed), behind :class:`SecureRandom`'s interface: the reference the secure stream's cost is
    measured against (``hutchinson-torch-rng``). Insecure; benchmark only."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def normal(self, shape, address, *, std=1.0, dtype=torch.float32, device="cpu"):
        return torch.randn(shape, generator=self.generator, dtype=dtype).mul_(std).to(device)


def _randomness(kind: str, seed: int):
    return SecureRandom.from_seed(seed, "benchmark") if kind == "secure" else TorchRandom(seed)


def smollm2_shaped(layers: int, tied: bool) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        tie_word_embeddings=tied,
        rope_theta=100000.0,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).train()


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _reset_peak() -> int:  # Linux: writing 5 to clear_refs resets VmHWM
    """Free what can be freed, reset the high-water mark; returns the idle resident set (bytes)."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kb("VmRSS") * 1024


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of tensor storages allocated inside the mode and still alive (outputs that alias an
    input's storage — views, in-place results, reshapes — are not new memory and are not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: set[int] = set()

    def _free(self, ptr: int, nbytes: int) -> None:
        self._storages.discard(ptr)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr in seen or ptr in self._storages:
                continue
            nbytes = t.untyped_storage().nbytes()
            self._storages.add(ptr)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._free, ptr, nbytes)
        return out


def _batch(seq_len: int, batch: int) -> dict:
    gen = torch.Generator().manual_seed(seq_len)
    ids = torch.randint(0, 49152, (batch, seq_len), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _time_steps(step, steps: int) -> list[tuple[float, float]]:
    """(wall seconds, process CPU seconds) of each timed step, after one warm-up step."""
    times = []
    for _ in range(steps + 1):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times[1:]


def run_nonprivate(model, batch, steps):
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)

    def step():
        opt.zero_grad(set_to_none=True)
        causal_lm_losses(model, batch).sum().backward()
        opt.step()

    return _time_steps(step, steps), None


def run_private(model, batch, steps, norm_mode, probes, bookkeeping, randomness):
    clipper = PerSampleClipper(
        model,
        causal_lm_losses,
        max_grad_norm=1.0,
        norm_mode=norm_mode,
        probes=probes,
        bookkeeping=bookkeeping,
        randomness=_randomness(randomness, 1),
    )
    opt = DPOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-5),
        clipper,
        noise_multiplier=1.0,
        expected_batch_size=1.0,
        randomness=_randomness(randomness, 2),
    )

    def step():
        opt.zero_grad()
        clipper.clipped_backward(batch)
        opt.step()

    times = _time_steps(step, steps)
    measured = {"peak": 0}
    original = clipper.total_sq_norms

    def measuring(factors, batch_size):
        with LiveTensorBytes() as counter:
            out = original(factors, batch_size)
        measured["peak"] = max(measured["peak"], counter.peak)
        return out

    clipper.total_sq_norms = measuring
    step()
    clipper.capture.remove()
    return times, measured["peak"] / 2**20


def run_opacus(model, batch, steps):
    import opacus
    from torch.utils.data import DataLoader, TensorDataset

    ids = batch["input_ids"]
    vocab = model.config.vocab_size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp_model, opt, criterion, _ = opacus.PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.Adam(model.parameters(), lr=1e-5),
            data_loader=DataLoader(TensorDataset(ids), batch_size=ids.shape[0]),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            grad_sample_mode="ghost",
            criterion=torch.nn.CrossEntropyLoss(reduction="sum"),
            poisson_sampling=False,
            loss_reduction="sum",
        )

    def step():
        opt.zero_grad()
        logits = dp_model(input_ids=ids).logits[:, :-1]
        criterion(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1), shape=logits.shape).backward()
        opt.step()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _time_steps(step, steps), None


def measure(name, base, seq_len, batch_size, steps):
    """Run one mode on a fresh copy of ``base``; returns its raw measurement."""
    idle = _reset_peak()
    model = copy.deepcopy(base)
    batch = _batch(seq_len, batch_size)
    if name.startswith("nonprivate"):
        times, norm_mb = run_nonprivate(model, batch, steps)
    elif name == "opacus-ghost":
        times, norm_mb = run_opacus(model, batch, steps)
    else:
        times, norm_mb = run_private(model, batch, steps, *PRIVATE_MODES[name])
    peak = _status_kb("VmHWM") * 1024 - idle
    del model
    return {
        "mode": name,
        "seq_len": seq_len,
        "step_cpu_s": statistics.median(t[1] for t in times),
        "step_wall_s": statistics.median(t[0] for t in times),
        "peak_memory_mb": peak / 2**20,
        "norm_memory_mb": norm_mb,
    }


def profile_hutchinson(base, seq_len, batch_size) -> list[dict]:
    """Where a Hutchinson + book-keeping step spends its time (stages and top operators, CPU ms)."""
    model = copy.deepcopy(base)
    batch = _batch(seq_len, batch_size)
    clipper = PerSampleClipper(model, causal_lm_losses, max_grad_norm=1.0, norm_mode="hutchinson", probes=32)
    opt = DPOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-5),
        clipper,
        noise_multiplier=1.0,
        expected_batch_size=1.0,
        randomness=SecureRandom.from_seed(2, "benchmark"),
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.zero_grad()
        clipper.clipped_backward(batch)
        opt.step()
    clipper.capture.remove()
    events = prof.key_averages()
    stages = [{"name": e.key, "cpu_total_ms": e.cpu_time_total / 1e3} for e in events if e.key.startswith("privlm.")]
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    return stages + [{"name": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3} for e in ops]


def plot(rows: list[dict], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    modes = [m for m in dict.fromkeys(r["mode"] for r in rows) if not m.startswith("nonprivate")]
    for mode in modes:
        pts = [r for r in rows if r["mode"] == mode]
        x = [r["seq_len"] for r in pts]
        axes[0].plot(x, [r["step_time_ratio"] for r in pts], marker="o", label=mode)
        axes[1].plot(x, [r["peak_memory_ratio"] for r in pts], marker="o", label=mode)
        if pts[0]["norm_memory_mb"] is not None:
            axes[2].plot(x, [r["norm_memory_mb"] for r in pts], marker="o", label=mode)
    for ax, title in zip(axes, ("step time / non-private", "peak memory / non-private", "norm memory (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length T")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].axhline(1.25, color="grey", ls="--", lw=0.8)
    axes[1].axhline(1.15, color="grey", ls="--", lw=0.8)
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle("Per-sample norm modes, SmolLM2-shaped Llama (ratios within one run)")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"T = 256, 1 layer, 1 timed step, modes {', '.join(QUICK_MODES)} beside non-private; no profile",
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON output (PNG written next to it)")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-lens", type=int, nargs="*", default=None)
    parser.add_argument("--steps", type=int, default=None, help="timed steps per mode (after one warm-up)")
    parser.add_argument(
        "--modes",
        nargs="*",
        default=None,
        help="only these modes (and the non-private references they are compared with)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: CPU time is not inflated by spin-waiting on a busy machine)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    seq_lens = list(args.seq_lens or (QUICK_T if args.quick else FULL_T))
    layers = args.layers or (1 if args.quick else 3)
    steps = args.steps or (1 if args.quick else 2)
    torch.manual_seed(0)
    names = ["nonprivate", *PRIVATE_MODES, "nonprivate-untied", "opacus-ghost"]
    modes = args.modes or (list(QUICK_MODES) if args.quick else None)
    if modes:
        unknown = set(modes) - set(names)
        if unknown:
            parser.error(f"unknown modes {sorted(unknown)}; known: {names}")
        wanted = set(modes) | {"nonprivate"} | ({"nonprivate-untied"} if "opacus-ghost" in modes else set())
        names = [n for n in names if n in wanted]
    tied = smollm2_shaped(layers, tied=True)
    untied = smollm2_shaped(layers, tied=False) if "nonprivate-untied" in names else None
    rows, profile = [], None
    for seq_len in seq_lens:
        raw = {}
        for name in names:
            base = untied if name in ("nonprivate-untied", "opacus-ghost") else tied
            try:
                raw[name] = measure(name, base, seq_len, args.batch, steps)
            except (RuntimeError, NotImplementedError, MemoryError) as err:  # report, keep the other modes
                raw[name] = {"mode": name, "seq_len": seq_len, "error": f"{type(err).__name__}: {err}"[:300]}
            print(json.dumps(raw[name]), flush=True)
        for name, row in raw.items():
            ref = raw["nonprivate-untied" if name == "opacus-ghost" else "nonprivate"]
            if "error" not in row and "error" not in ref:
                row["step_time_ratio"] = row["step_cpu_s"] / ref["step_cpu_s"]
                row["peak_memory_ratio"] = row["peak_memory_mb"] / ref["peak_memory_mb"]
            rows.append(row)
        if not args.quick:
            profile = {"seq_len": seq_len, "stages_and_top_ops": profile_hutchinson(tied, seq_len, args.batch)}
        result = {
            "model": {
                "kind": "LlamaForCausalLM (SmolLM2-shaped, random init)",
                "hidden": 576,
                "vocab": 49152,
                "layers": layers,
                "tied_embeddings": True,
                "batch": args.batch,
                "dtype": "float32",
            },
            "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": "cpu"},
            "steps_timed": steps,
            "seq_lens_done": seq_lens[: seq_lens.index(seq_len) + 1],
            "rows": rows,
            "profile_hutchinson_bookkeeping": profile,
        }
        write_results(result, args.out)  # after every T, so a long run that is stopped keeps what it measured


def write_results(result: dict, out: Path) -> None:
    """JSON and PNG next to it, each written to a temporary file and moved into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)
    plot([r for r in result["rows"] if "error" not in r], out.with_suffix(".png"))


if __name__ == "__main__":
    main()
