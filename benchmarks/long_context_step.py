"""One private DP-SGD step of the top N decoder blocks over a cached frozen prefix, at long context, per norm mode.

    python benchmarks/long_context_step.py                       # CPU, within a 14-minute budget
    python benchmarks/long_context_step.py --device cuda --seq-lens 4096,8192,16384

The step: the hidden states entering block L − N (random (B, T, d) tensors standing in for the cached
frozen prefix) go through N ``LlamaDecoderLayer`` (trained; rotary embeddings computed inside from the
positions by ``LlamaRotaryEmbedding``, SDPA causal attention), the final ``LlamaRMSNorm`` (trained) and the
output layer (a frozen ``nn.Linear`` d → vocab: with tied embeddings it is the embedding matrix, which sits
in the frozen prefix), applied only at the K positions that carry loss (the last K tokens, a completion).
Loss: each example's mean token cross-entropy over its K positions (a function of that example alone).

Modes, same weights and inputs: ``nonprivate`` (the same module, plain backward, no hooks) and, through
privlm's ``PrivacyEngine(norm_mode, probes).make_private(..., noise_multiplier=1.0)`` +
``clipped_backward`` + ``optimizer.step()`` (physical batch = logical batch = B, book-keeping), ``ghost``,
``mixed``, ``exact``, ``hutchinson`` (k = 32) and ``hutchpp`` (m = 32). AdamW everywhere.

Each cell (shape, T, mode) runs in a fresh process on CPU (``--isolate process``; in-process on CUDA):
one warm-up step, then ``--repeats`` timed steps; the step time is their median (process CPU seconds on
CPU — one torch thread, so other load on a shared machine does not count; wall seconds on CUDA).
Peak memory is the memory the timed steps need on top of what is resident before them (weights,
optimizer state, inputs, the warm-up's allocations freed): on CPU the Linux high-water mark of the
resident set (VmHWM, reset through /proc/self/clear_refs after gc and malloc_trim) minus the resident set
at the reset; on CUDA ``max_memory_allocated`` minus ``memory_allocated`` after ``reset_peak_memory_stats``.
With ``--repeats 1`` the "median" is that one step. Ratios are to ``nonprivate`` of the same shape and T,
measured in the same run; ``checks`` compares Hutchinson with the best exact mode (lowest peak memory of
exact/ghost/mixed). Defaults: B = 2, N = 2, K = 32, float32, AdamW, ``PrivacyEngine(seed=0)``.

With a time budget (``--budget-s``; 840 s on CPU by default) the (shape, T) groups run cheapest first, and a
group predicted (from the seconds per FLOP measured so far) not to fit the remaining budget is written out
as skipped, with the reason. ``--append`` keeps the cells of an earlier run in ``--out`` (another shape, T or
repeat count), so a CPU budget can be spread over several calls.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

RESULT_MARK = "@@long_context_step "
MODES: dict[str, str | None] = {  # name: privlm norm mode (None: non-private)
    "nonprivate": None,
    "ghost": "ghost",
    "mixed": "mixed",
    "exact": "exact",
    "hutchinson": "hutchinson",
    "hutchpp": "hutchpp",
}
EXACT_MODES = ("exact", "ghost", "mixed")
# Llama shapes. rope: default RoPE with the model's theta. Llama-3.2-1B's "llama3" rope scaling only changes the
# inverse frequencies computed once at init (transformers' LlamaRotaryEmbedding), not the work of a step.
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        rope_theta=100000.0,
        num_hidden_layers=30,
    ),
    "llama-3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
        num_hidden_layers=16,
    ),
    "tiny": dict(  # the smoke test's
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        rope_theta=10000.0,
        num_hidden_layers=4,
    ),
}


def llama_config(shape: str, seq_len: int):
    from transformers import LlamaConfig

    config = LlamaConfig(
        **SHAPES[shape],
        tie_word_embeddings=True,
        max_position_embeddings=max(seq_len, 2048),
        attn_implementation="sdpa",
    )
    config._attn_implementation = "sdpa"  # decoder layers built directly read it from the config
    return config


class TopBlocks(nn.Module):
    """The top ``blocks`` decoder layers of a Llama, its final norm and its (frozen) output layer, applied to
    the hidden states entering them; logits only at the ``loss_tokens`` positions predicting the last tokens."""

    def __init__(self, config, blocks: int, loss_tokens: int) -> None:
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

        super().__init__()
        first = config.num_hidden_layers - blocks
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, layer_idx=first + i) for i in range(blocks))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False).requires_grad_(False)
        self.loss_tokens = loss_tokens

    def forward(self, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        position_embeddings = self.rotary(hidden, position_ids)
        for layer in self.layers:
            out = layer(hidden, attention_mask=None, position_ids=position_ids, position_embeddings=position_embeddings)
            hidden = out[0] if isinstance(out, tuple) else out
        k = self.loss_tokens
        return self.lm_head(self.norm(hidden[:, -k - 1 : -1]))  # position t predicts token t + 1


def per_sample_losses(module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B,) mean token cross-entropy of each example over its loss positions."""
    logits = module(batch["hidden"], batch["position_ids"])
    labels = batch["labels"]
    ce = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
    return ce.view(labels.shape).mean(1)


def make_batch(config, batch: int, seq_len: int, loss_tokens: int, dtype, device) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seq_len)
    return {
        "hidden": torch.randn(batch, seq_len, config.hidden_size, generator=gen).to(device=device, dtype=dtype),
        "position_ids": torch.arange(seq_len).repeat(batch, 1).to(device),  # per sample: dim 0 indexes examples
        "labels": torch.randint(0, config.vocab_size, (batch, loss_tokens), generator=gen).to(device),
    }


def step_flops(shape: str, spec: dict[str, Any]) -> float:
    """A rough FLOP count of one training step (3 × forward), used only to predict what fits a budget."""
    s = SHAPES[shape]
    d, ff = s["hidden_size"], s["intermediate_size"]
    kv = d // s["num_attention_heads"] * s["num_key_value_heads"]
    linear = 2 * d * d + 2 * d * kv + 3 * d * ff
    b, t, n = spec["batch"], spec["seq_len"], spec["blocks"]
    forward = b * n * (2 * t * linear + 2 * t * t * d) + 2 * b * spec["loss_tokens"] * d * s["vocab_size"]
    return 3.0 * forward


# ---------------------------------------------------------------- memory


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


class CpuPeak:
    """Peak resident memory above the resident set at :meth:`reset` (bytes). Linux: VmHWM after resetting it
    through /proc/self/clear_refs; elsewhere a psutil sampler (every 2 ms) if psutil is installed."""

    def __init__(self) -> None:
        self.method = "VmHWM"
        self.baseline = 0
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()
        self._sampled = 0

    def reset(self) -> None:
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.baseline = _status_kb("VmRSS") * 1024
            return
        except OSError:
            pass
        import psutil

        self.method = "psutil-sampled-rss"
        proc = psutil.Process()
        self.baseline = self._sampled = proc.memory_info().rss

        def sample() -> None:
            while not self._stop.wait(0.002):
                self._sampled = max(self._sampled, proc.memory_info().rss)

        self._sampler = threading.Thread(target=sample, daemon=True)
        self._sampler.start()

    def peak_total(self) -> int:
        if self._sampler is None:
            return _status_kb("VmHWM") * 1024
        self._stop.set()
        self._sampler.join()
        return self._sampled


class CudaPeak:
    method = "torch.cuda.max_memory_allocated"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0

    def reset(self) -> None:
        gc.collect()
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.baseline = torch.cuda.memory_allocated(self.device)

    def peak_total(self) -> int:
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)


# ---------------------------------------------------------------- one cell


def _coverage(private: Any, seen: set[nn.Parameter]) -> dict[str, int]:
    """Which trainable parameters privlm hooked, and which got per-sample factors in the warm-up step."""
    clipper = private.clipper
    trainable = set(clipper.params)
    hooked = {p for m in clipper.capture.layers for p in m.parameters(recurse=False) if p.requires_grad}
    return {
        "params_trainable": len(trainable),
        "params_hooked": len(hooked & trainable),
        "params_with_factors": len(seen & trainable),
        "numel_trainable": sum(p.numel() for p in trainable),
        "numel_with_factors": sum(p.numel() for p in seen & trainable),
    }


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the module and inputs of ``spec``, take one warm-up and ``repeats`` timed steps in its mode."""
    from torch.utils.data import DataLoader

    from privlm.dpsgd.engine import PrivacyEngine

    device = torch.device(spec["device"])
    dtype = getattr(torch, spec["dtype"])
    config = llama_config(spec["shape"], spec["seq_len"])
    torch.manual_seed(0)
    with device:  # initialised where it runs (a 1 GB output layer for the Llama-3.2-1B shape)
        module = TopBlocks(config, spec["blocks"], spec["loss_tokens"]).to(dtype=dtype).train()
    batch = make_batch(config, spec["batch"], spec["seq_len"], spec["loss_tokens"], dtype, device)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    norm_mode = MODES[spec["mode"]]
    # --precision bf16: float32 weights, forward and backward under bf16 autocast (privlm train --precision bf16)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec.get("precision") == "bf16")
    extra: dict[str, Any] = {}
    seen: set[nn.Parameter] = set()

    if norm_mode is None:

        def backward() -> None:
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                per_sample_losses(module, batch).sum().backward()

        update = optimizer.step

    else:
        engine = PrivacyEngine(norm_mode=norm_mode, probes=spec["probes"], seed=0)
        rows = list(range(spec["batch"]))
        private, dp_optimizer, _ = engine.make_private(
            module,
            optimizer,
            DataLoader(rows, batch_size=len(rows)),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            loss_fn=per_sample_losses,
        )
        clipper = private.clipper
        measure_norms = clipper.total_sq_norms

        def noting(factors, batch_size):
            seen.update(factors)
            return measure_norms(factors, batch_size)

        def backward() -> None:
            dp_optimizer.zero_grad()
            with autocast:
                private.clipped_backward(batch)

        update = dp_optimizer.step  # noise (a secure draw per trained number) and AdamW

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    peak = CudaPeak(device) if device.type == "cuda" else CpuPeak()
    if norm_mode is not None:
        clipper.total_sq_norms = noting
    backward()  # warm-up: allocates the optimizer state
    update()
    sync()
    if norm_mode is not None:
        clipper.total_sq_norms = measure_norms
        extra = _coverage(private, seen)
    peak.reset()
    walls, cpus, parts = [], [], []  # parts: (backward, update) seconds on the step's time basis
    clock = time.process_time if spec["time_basis"] == "cpu" else time.perf_counter
    for _ in range(spec["repeats"]):
        sync()
        wall, cpu, start = time.perf_counter(), time.process_time(), clock()
        backward()
        sync()
        middle = clock()
        update()
        sync()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        parts.append((middle - start, clock() - middle))
    total = peak.peak_total()
    step_wall, step_cpu = statistics.median(walls), statistics.median(cpus)
    out = {
        "shape": spec["shape"],
        "seq_len": spec["seq_len"],
        "mode": spec["mode"],
        "status": "ok",
        "repeats": spec["repeats"],
        "batch": spec["batch"],
        "loss_tokens": spec["loss_tokens"],
        "step_s": step_cpu if spec["time_basis"] == "cpu" else step_wall,
        "step_wall_s": step_wall,
        "step_cpu_s": step_cpu,
        # the step's two parts: forward + (clipped) backward, which a micro-batch repeats, and the update
        # (noise + AdamW), once per logical batch: with gradient accumulation it is amortized over micro-batches
        "backward_s": statistics.median(b for b, _ in parts),
        "update_s": statistics.median(u for _, u in parts),
        "wall_s_each": walls,
        "cpu_s_each": cpus,
        "peak_memory_mb": max(0, total - peak.baseline) / 2**20,
        "resident_before_mb": peak.baseline / 2**20,
        "peak_total_mb": total / 2**20,
        "memory_method": peak.method,
        **extra,
    }
    finite = all(math.isfinite(float(p.detach().float().abs().max())) for p in params)
    out["params_finite_after"] = finite
    return out


def run_isolated(spec: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """``run_cell`` in a fresh Python process; its result, or an error row."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "error", "reason": f"timed out after {timeout:.0f} s (the remaining budget)"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    tail = proc.stderr.strip().splitlines()[-1:] or [""]
    killed = " (killed: out of memory?)" if proc.returncode in (-9, 137) else ""
    return {"status": "error", "reason": f"exit {proc.returncode}{killed}: {tail[0][:300]}"}


def run_in_process(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        return run_cell(spec)
    except (RuntimeError, MemoryError) as err:  # e.g. CUDA out of memory: report it, keep the other cells
        return {"status": "error", "reason": f"{type(err).__name__}: {err}"[:300]}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ---------------------------------------------------------------- the run


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Ratios of every ok row to the ok ``nonprivate`` row of its (shape, T)."""
    refs = {(r["shape"], r["seq_len"]): r for r in rows if r["mode"] == "nonprivate" and r["status"] == "ok"}
    for r in rows:
        ref = refs.get((r["shape"], r["seq_len"]))
        if r["status"] != "ok" or ref is None:
            continue
        r["step_time_ratio"] = r["step_s"] / ref["step_s"]
        if "backward_s" in r and "backward_s" in ref:  # cells of runs before the split lack it
            r["backward_time_ratio"] = r["backward_s"] / ref["backward_s"]
        r["peak_memory_ratio"] = r["peak_memory_mb"] / ref["peak_memory_mb"] if ref["peak_memory_mb"] > 0 else None
        r["peak_total_ratio"] = r["peak_total_mb"] / ref["peak_total_mb"]


def checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (shape, T): Hutchinson's peak memory against the best exact mode's, and its step against non-private."""
    out = []
    for key in dict.fromkeys((r["shape"], r["seq_len"]) for r in rows):
        cell = {r["mode"]: r for r in rows if (r["shape"], r["seq_len"]) == key and r["status"] == "ok"}
        hutch = cell.get("hutchinson")
        exact = [cell[m] for m in EXACT_MODES if m in cell]
        if hutch is None or not exact or "step_time_ratio" not in hutch:
            continue
        best = min(exact, key=lambda r: r["peak_memory_mb"])
        mem = hutch["peak_memory_mb"] / best["peak_memory_mb"] if best["peak_memory_mb"] > 0 else None
        out.append(
            {
                "shape": key[0],
                "seq_len": key[1],
                "best_exact_mode": best["mode"],
                "hutchinson_peak_memory_vs_best_exact": mem,
                "hutchinson_peak_total_vs_best_exact": hutch["peak_total_mb"] / best["peak_total_mb"],
                "hutchinson_step_time_ratio": hutch["step_time_ratio"],
                "hutchinson_backward_time_ratio": hutch.get("backward_time_ratio"),
                "memory_at_most_0.85_of_best_exact": mem is not None and mem <= 0.85,
                "step_at_most_1.15_of_nonprivate": hutch["step_time_ratio"] <= 1.15,
            }
        )
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["cells"] if "step_time_ratio" in r]
    shapes = list(dict.fromkeys(r["shape"] for r in rows)) or ["(no cell measured)"]
    fig, axes = plt.subplots(len(shapes), 2, figsize=(11, 3.6 * len(shapes)), squeeze=False)
    for row_axes, shape in zip(axes, shapes):
        for mode in MODES:
            if mode == "nonprivate":
                continue
            pts = sorted((r for r in rows if r["shape"] == shape and r["mode"] == mode), key=lambda r: r["seq_len"])
            if not pts:
                continue
            x = [r["seq_len"] for r in pts]
            row_axes[0].plot(x, [r["step_time_ratio"] for r in pts], marker="o", label=mode)
            row_axes[1].plot(x, [r["peak_memory_ratio"] or float("nan") for r in pts], marker="o", label=mode)
        for ax, what in zip(row_axes, ("step time", "peak step memory")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context length T")
            ax.set_title(f"{shape}: {what} / non-private", fontsize=10)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.grid(alpha=0.3)
        row_axes[0].axhline(1.15, color="grey", ls="--", lw=0.8)
        if row_axes[0].get_legend_handles_labels()[0]:
            row_axes[0].legend(fontsize=8)
    c = result["config"]
    fig.suptitle(
        f"top {c['blocks']} blocks over a cached prefix, B = {c['batch']}, K = {c['loss_tokens']} loss tokens, "
        f"{c['dtype']}, {result['machine']['device']}",
        fontsize=10,
    )
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def write_results(result: dict[str, Any], out: Path) -> None:
    shapes, modes = list(SHAPES), list(MODES)
    result["cells"].sort(key=lambda c: (shapes.index(c["shape"]), c["seq_len"], modes.index(c["mode"])))
    result["checks"].sort(key=lambda c: (shapes.index(c["shape"]), c["seq_len"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, out)
    plot(result, out.with_suffix(".png"))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(known: list[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; known: {', '.join(known)}")
        return names

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument(
        "--precision",
        default="float32",
        choices=("float32", "bf16"),
        help="bf16: float32 weights, forward/backward under bf16 autocast (privlm train --precision bf16)",
    )
    parser.add_argument("--seq-lens", type=_ints, default=[1024, 2048, 4096], help="comma-separated T")
    parser.add_argument("--shapes", type=_names(list(SHAPES)), default=["smollm2-135m", "llama-3.2-1b"])
    parser.add_argument("--modes", type=_names(list(MODES)), default=list(MODES), help="nonprivate is always added")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed steps per cell after a warm-up (CPU 2, CUDA 3)"
    )
    parser.add_argument("--batch", type=int, default=2, help="B: physical = logical batch")
    parser.add_argument("--blocks", type=int, default=2, help="N top decoder blocks trained")
    parser.add_argument("--loss-tokens", type=int, default=32, help="K: positions carrying loss (the last K tokens)")
    parser.add_argument("--probes", type=int, default=32, help="k of hutchinson, m of hutchpp")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: 1 on CPU, torch's on CUDA)"
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-clock budget of the whole run (default: 840 s on CPU, none on CUDA; 0: none)",
    )
    parser.add_argument("--isolate", choices=("process", "none"), default=None, help="default: process on CPU")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "long_context_step.json")
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the cells already in --out (those of other shapes/T/modes; e.g. another run's repeats)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.repeats = args.repeats or (3 if cuda else 2)
    args.isolate = args.isolate or ("none" if cuda else "process")
    args.threads = args.threads if args.threads is not None else (0 if cuda else 1)
    args.budget_s = (0 if cuda else 840) if args.budget_s is None else args.budget_s
    args.modes = ["nonprivate", *[m for m in args.modes if m != "nonprivate"]]
    return args


def _step_rate(cells: list[dict[str, Any]], config: dict[str, Any]) -> tuple[float, float]:
    """(FLOPs, seconds) of the ok cells' steps (warm-up included; process start-up and one-time costs such as
    CUDA's start or compiling the noise kernel not: seen on an H200, 50 s of them for 0.5 s of steps), to
    predict what later groups cost on this device."""
    flops = seconds = 0.0
    for c in cells:
        if c["status"] == "ok":
            steps = 1 + len(c["wall_s_each"])
            flops += steps * step_flops(c["shape"], {**config, **c})
            seconds += steps * c["step_wall_s"]
    return flops, seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        spec = json.loads(args.worker)
        if spec["threads"]:
            torch.set_num_threads(spec["threads"])
        print(RESULT_MARK + json.dumps(run_cell(spec)), flush=True)
        return {}
    import transformers

    cuda = args.device.startswith("cuda")
    start = time.perf_counter()
    base = {
        "device": args.device,
        "dtype": args.dtype,
        "precision": args.precision,
        "batch": args.batch,
        "blocks": args.blocks,
        "probes": args.probes,
        "repeats": args.repeats,
        "time_basis": "wall" if cuda else "cpu",
        "threads": args.threads,
    }
    result: dict[str, Any] = {
        "benchmark": "long_context_step",
        "config": {
            **base,
            "loss_tokens": args.loss_tokens,
            "isolate": args.isolate,
            "budget_s": args.budget_s or None,
            "optimizer": "AdamW lr 1e-5",
            "noise_multiplier": 1.0,
            "max_grad_norm": 1.0,
            "attention": "sdpa, causal (is_causal, no mask)",
            "rope": "default RoPE, the model's rope_theta (no llama3 scaling: it only changes inv_freq at init)",
            "trained": "N decoder layers + final RMSNorm; output layer frozen, applied at the K loss positions",
            "step_s": "median over the timed steps, after one warm-up; process CPU seconds on CPU, wall on CUDA",
            "peak_memory_mb": (
                "peak memory of the timed steps above what is resident just before them (weights, optimizer "
                "state, inputs): CPU VmHWM - VmRSS after gc + malloc_trim + clear_refs, in a fresh process "
                "per cell; CUDA max_memory_allocated - memory_allocated after reset_peak_memory_stats"
            ),
            "peak_total_mb": "the high-water mark itself (CPU: whole process incl. the Python/torch runtime)",
        },
        "machine": {
            "device": torch.cuda.get_device_name(args.device)
            if cuda
            else f"cpu ({platform.processor() or platform.machine()})",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        "shapes": {s: SHAPES[s] for s in args.shapes},
        "cells": [],
        "checks": [],
        "groups": [],
    }
    spent_flops, spent_s = 0.0, 0.0  # what the groups measured so far cost: predicts the next ones
    groups = [(s, t) for s in args.shapes for t in args.seq_lens]
    if args.append and args.out.exists():  # cells of other runs, less those this run measures again
        old = json.loads(args.out.read_text())
        mine = {(s, t, m) for s, t in groups for m in args.modes}
        result["cells"] = [c for c in old["cells"] if (c["shape"], c["seq_len"], c["mode"]) not in mine]
        result["shapes"] = {**old.get("shapes", {}), **result["shapes"]}
        wall = old.get("wall_s_this_run", old.get("wall_s_total"))
        earlier = {"config": old["config"], "machine": old["machine"], "wall_s": wall}
        result["earlier_runs"] = [*old.get("earlier_runs", []), earlier]
        result["groups"] = old.get("groups", [])
        if old["config"]["device"] == args.device:
            spent_flops, spent_s = _step_rate(old["cells"], old["config"])
    spec_of = {
        (s, t): {**base, "shape": s, "seq_len": t, "loss_tokens": min(args.loss_tokens, t - 1)} for s, t in groups
    }
    groups.sort(key=lambda g: step_flops(g[0], spec_of[g]))  # cheapest first: a budget keeps the most cells
    for group in groups:
        shape, seq_len = group
        elapsed = time.perf_counter() - start
        left = args.budget_s - elapsed if args.budget_s else None
        flops = step_flops(shape, spec_of[group]) * (1 + args.repeats) * len(args.modes)
        predicted = flops * spent_s / spent_flops if spent_flops else None
        if left is not None and (left <= 0 or (predicted is not None and predicted > left)):
            why = f"predicted {predicted:.0f} s" if predicted is not None else "no time"
            reason = f"would not fit the budget: {why} for its {len(args.modes)} cells, {max(left, 0):.0f} s left"
            for mode in args.modes:
                result["cells"].append(
                    {"shape": shape, "seq_len": seq_len, "mode": mode, "status": "skipped", "reason": reason}
                )
            print(f"skip {shape} T={seq_len}: {reason}", file=sys.stderr, flush=True)
            continue
        group_start = time.perf_counter()
        for mode in args.modes:
            spec = {**spec_of[group], "mode": mode}
            left = args.budget_s - (time.perf_counter() - start) if args.budget_s else None
            if left is not None and left <= 0:
                row = {"status": "skipped", "reason": "the budget was spent inside this group"}
            elif args.isolate == "process":
                row = run_isolated(spec, timeout=left)
            else:
                row = run_in_process(spec)
            row = {"shape": shape, "seq_len": seq_len, "mode": mode, **row}
            result["cells"].append(row)
            shown = {
                k: row.get(k) for k in ("shape", "seq_len", "mode", "status", "step_s", "peak_memory_mb", "reason")
            }
            print(json.dumps({k: v for k, v in shown.items() if v is not None}), file=sys.stderr, flush=True)
        group_flops, group_s = _step_rate(result["cells"][-len(args.modes) :], spec_of[group])
        spent_flops += group_flops
        spent_s += group_s
        result["groups"].append(
            {
                "shape": shape,
                "seq_len": seq_len,
                "repeats": args.repeats,
                "cells": len(args.modes),
                "flops": flops,
                "wall_s": time.perf_counter() - group_start,
            }
        )
        add_ratios(result["cells"])
        result["checks"] = checks(result["cells"])
        result["wall_s_this_run"] = time.perf_counter() - start
        write_results(result, args.out)  # after every group: a run that is stopped keeps what it measured
    add_ratios(result["cells"])
    result["checks"] = checks(result["cells"])
    result["wall_s_this_run"] = time.perf_counter() - start
    write_results(result, args.out)
    return result


if __name__ == "__main__":
    main()
