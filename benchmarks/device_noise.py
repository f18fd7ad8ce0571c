"""Secure DP noise where the model lives: values per second of each path, and the share of a GPU step.

Paths, in one run on the same key and address (a Gaussian per value, cast to float32):

- ``openssl``: :class:`privlm.randomness.SecureRandom` on the CPU (OpenSSL ChaCha20, float64 Box–Muller);
  on an accelerator the values must then be copied to the device (``openssl+copy`` when one is present);
- ``torch-eager``: :func:`privlm.chacha.normals` (the same keystream in torch tensor ops), unfused;
- ``torch-compiled``: the same with the ChaCha20 block function fused by ``torch.compile`` (what a CUDA
  device runs by default);
- ``torch.randn`` for scale (not a secure generator).

The projection: noise for a 1.24 B-parameter step (Llama-3.2-1B's count) at each path's rate, as a share
of an assumed GPU step. The step time is an assumption, stated in the JSON: 6·N·tokens FLOPs for a
forward and backward pass of B·T = 8·1,024 tokens at 40 % of an H100/H200's 989 dense bf16 TFLOP/s,
≈ 0.15 s; privlm's DP step adds per-sample clipping on top, which only lowers the share.

    python benchmarks/device_noise.py                      # CPU; --device cuda on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from privlm import chacha  # noqa: E402
from privlm.atomic import atomic_path, write_text_atomic  # noqa: E402
from privlm.randomness import SecureRandom  # noqa: E402

PARAMETERS_1B = 1_235_814_400  # Llama-3.2-1B
ASSUMED_STEP_S = 6 * PARAMETERS_1B * 8 * 1024 / (0.4 * 989e12)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def rate(draw, n: int, repeats: int, device: str) -> float:
    """Median values per second of ``draw()`` (which makes ``n`` values) over ``repeats`` calls after one warm-up."""
    draw()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        draw()
        _sync(device)
        times.append(time.perf_counter() - start)
    return n / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--values", type=int, default=1 << 21, help="values per draw")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/device_noise.json"))
    args = parser.parse_args()
    key, n, device = bytes(range(32)), args.values, args.device
    secure = SecureRandom(key, private=True)
    paths = {
        "openssl": lambda: SecureRandom.normal(secure, (n,), (1,)),
        "torch-eager": lambda: chacha.normals(key, (1,), n, device, block_fn=chacha.blocks).float(),
        "torch-compiled": lambda: chacha.normals(key, (1,), n, device, block_fn=chacha._compiled_blocks()).float(),
        "torch.randn (not secure)": lambda: torch.randn(n, device=device),
    }
    if device != "cpu":
        paths["openssl+copy"] = lambda: SecureRandom.normal(secure, (n,), (1,)).to(device)
    rates = {name: rate(draw, n, args.repeats, device) for name, draw in paths.items()}
    result = {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "values_per_draw": n,
        "values_per_second": rates,
        "assumed_1b_step_s": ASSUMED_STEP_S,
        "step_assumption": "6·N·tokens FLOPs, N = 1.24e9, B·T = 8·1024 tokens, 40 % of 989 bf16 TFLOP/s",
        "share_of_1b_step": {name: PARAMETERS_1B / r / ASSUMED_STEP_S for name, r in rates.items()},
    }
    write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(7, 3))
    names = list(rates)
    ax.barh(names, [rates[k] for k in names])
    ax.set_xscale("log")
    ax.set_xlabel(f"Gaussians per second ({result['device']}, {result['threads']} threads)")
    ax.set_title("secure DP noise: values per second per path")
    with atomic_path(args.out.with_suffix(".png")) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    for name in names:
        print(f"{name:28s} {rates[name]:10.3g}/s   1B step share {result['share_of_1b_step'][name]:8.2f}")


if __name__ == "__main__":
    main()
