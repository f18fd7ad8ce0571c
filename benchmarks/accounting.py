"""Accounting benchmark: ε after 10,000 DP-SGD steps, exact vs randomized clipping, side by side.

Run:  .venv/bin/python benchmarks/accounting.py [--out benchmarks/results/accounting.json]

Setting: σ = 1.0, q = 0.01, 10,000 steps, δ = 1e-5 (100 epochs). Every accountant starts cold
(caches cleared). Also reported: dp-accounting's own PLD accountant and prv-accountant on the exact run
(references), RDP, and the noise multiplier needed for ε = 0.7, δ = 1e-5 in a BBC-like fine-tuning run
(batch 64 of 1,780 training articles, q = 0.036, 20 epochs = 556 steps) with exact, Hutchinson (k = 32)
and Hutch++ (m = 96, accounted as k = 32) clipping, beside the paper's 4.073 (exact) and 4.354
(randomized). Writes the JSON to ``--out`` and a PNG plot (matplotlib, Agg) next to it.
Times are wall-clock seconds on this machine; compare the ratios, the absolute values depend on load.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import dp_accounting
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from privlm.privacy.accountant import DEFAULT_DISCRETIZATION, single_event_pld  # noqa: E402
from privlm.privacy.calibration import calibrate_noise_multiplier, dpsgd_epsilon  # noqa: E402

SIGMA, Q, STEPS, DELTA = 1.0, 0.01, 10_000, 1e-5
PROBES = (16, 32, 64, 128, 256, 1024)
RATIO_SETTING = dict(target_epsilon=0.7, delta=1e-5, sample_rate=64 / 1780, steps=556)
PAPER_SIGMA = {"exact": 4.073, "randomized": 4.354}


def _timed(compute: Callable[[], float]) -> tuple[float, float]:
    single_event_pld.cache_clear()
    start = time.perf_counter()
    value = compute()
    return float(value), time.perf_counter() - start


def _dp_accounting_exact() -> float:
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=DEFAULT_DISCRETIZATION)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(SIGMA)), STEPS)
    return accountant.get_epsilon(DELTA)


def _prv_exact() -> float:
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prv = PRVAccountant(
            [PoissonSubsampledGaussianMechanism(sampling_probability=Q, noise_multiplier=SIGMA)],
            eps_error=0.01,
            delta_error=DELTA / 1000,
            max_self_compositions=[STEPS],
        )
        return prv.compute_epsilon(DELTA, [STEPS])[2]  # upper bound


def run() -> dict:
    rows: list[dict] = []

    def add(name: str, compute: Callable[[], float], **extra: object) -> None:
        epsilon, seconds = _timed(compute)
        rows.append({"name": name, "epsilon": epsilon, "seconds": seconds, **extra})

    add("exact (privlm PLD)", lambda: dpsgd_epsilon(SIGMA, Q, STEPS, DELTA), clipping="exact")
    add("exact (dp-accounting PLD)", _dp_accounting_exact, clipping="exact")
    add("exact (prv-accountant, upper)", _prv_exact, clipping="exact")
    add("exact (privlm RDP)", lambda: dpsgd_epsilon(SIGMA, Q, STEPS, DELTA, method="rdp"), clipping="exact")
    for k in PROBES:
        add(
            f"hutchinson k={k}",
            lambda k=k: dpsgd_epsilon(SIGMA, Q, STEPS, DELTA, "hutchinson", k),
            clipping="hutchinson",
            probes=k,
        )
    add(
        "hutchpp m=96 (k=32)",
        lambda: dpsgd_epsilon(SIGMA, Q, STEPS, DELTA, "hutchpp", 96),
        clipping="hutchpp",
        probes=96,
    )
    base = rows[0]["seconds"]
    for row in rows:
        row["time_ratio_to_exact"] = row["seconds"] / base

    sigmas = {}
    for kind, probes in (("exact", None), ("hutchinson", 32), ("hutchpp", 96)):
        sigma, seconds = _timed(
            lambda kind=kind, probes=probes: calibrate_noise_multiplier(
                RATIO_SETTING["target_epsilon"],
                RATIO_SETTING["delta"],
                RATIO_SETTING["sample_rate"],
                RATIO_SETTING["steps"],
                kind,
                probes,
            )
        )
        sigmas[kind] = {"noise_multiplier": sigma, "probes": probes, "seconds": seconds}
    ratio = {kind: sigmas[kind]["noise_multiplier"] / sigmas["exact"]["noise_multiplier"] for kind in sigmas}
    return {
        "setting": {
            "noise_multiplier": SIGMA,
            "sample_rate": Q,
            "steps": STEPS,
            "delta": DELTA,
            "value_discretization": DEFAULT_DISCRETIZATION,
        },
        "epsilon_10k_steps": rows,
        "sigma_at_target": {
            "setting": RATIO_SETTING,
            "sigmas": sigmas,
            "ratio_to_exact": ratio,
            "paper": {**PAPER_SIGMA, "ratio": PAPER_SIGMA["randomized"] / PAPER_SIGMA["exact"]},
        },
    }


def plot(results: dict, path: Path) -> None:
    rows = results["epsilon_10k_steps"]
    exact = rows[0]["epsilon"]
    hutch = [r for r in rows if r.get("clipping") == "hutchinson"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot([r["probes"] for r in hutch], [r["epsilon"] for r in hutch], "o-", label="Hutchinson (envelope χ²_k/k)")
    left.axhline(exact, color="k", linestyle="--", label=f"exact clipping ε = {exact:.3f}")
    left.set_xscale("log", base=2)
    left.set_xlabel("probes k")
    left.set_ylabel("ε at δ = 1e-5")
    left.set_title(f"σ={SIGMA}, q={Q}, {STEPS:,} steps")
    left.legend()
    right.barh([r["name"] for r in rows], [r["time_ratio_to_exact"] for r in rows])
    right.set_xlabel("time / time of exact (privlm PLD)")
    right.set_title(f"cold start; exact took {rows[0]['seconds']:.2f} s")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results/accounting.json"),
        help="JSON output (PNG written next to it)",
    )
    args = parser.parse_args()
    results = run()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(tmp, args.out)
    png = args.out.with_suffix(".png")
    plot(results, png)

    console = Console()
    table = Table(title=f"ε after {STEPS:,} steps (σ={SIGMA}, q={Q}, δ={DELTA})")
    for column in ("accountant", "ε", "seconds", "time / exact"):
        table.add_column(column, justify="left" if column == "accountant" else "right")
    for row in results["epsilon_10k_steps"]:
        table.add_row(
            row["name"], f"{row['epsilon']:.4f}", f"{row['seconds']:.2f}", f"{row['time_ratio_to_exact']:.2f}"
        )
    console.print(table)
    target = results["sigma_at_target"]
    console.print(
        "σ for ε=0.7, δ=1e-5 (q=64/1780, 556 steps): "
        + ", ".join(f"{kind} {v['noise_multiplier']:.4f}" for kind, v in target["sigmas"].items())
        + f"; ratio hutchinson/exact {target['ratio_to_exact']['hutchinson']:.4f}"
        + f" (paper: {PAPER_SIGMA['randomized']}/{PAPER_SIGMA['exact']} = {target['paper']['ratio']:.4f})"
    )
    console.print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
