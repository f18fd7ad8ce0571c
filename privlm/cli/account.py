"""``privlm account``: ε of a DP-SGD run, or the noise multiplier for a target ε, per clipping kind."""

from __future__ import annotations

import math

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from privlm.cli._common import console, err_console, print_json
from privlm.errors import UserError

DEFAULT_PROBES = 32


def account(
    sample_rate: float = typer.Option(..., "--sample-rate", help="Poisson sampling rate q in (0, 1]."),
    steps: int = typer.Option(..., "--steps", help="Number of DP-SGD steps."),
    delta: float = typer.Option(..., "--delta", help="Target δ in (0, 1)."),
    noise_multiplier: float | None = typer.Option(
        None, "--noise-multiplier", help="σ (noise std / clipping norm): print ε."
    ),
    target_epsilon: float | None = typer.Option(None, "--target-epsilon", help="Target ε: print the calibrated σ."),
    clipping: str | None = typer.Option(
        None, "--clipping", help="exact | hutchinson | hutchpp (default: all three side by side)."
    ),
    probes: int | None = typer.Option(
        None,
        "--probes",
        help=f"Probes k (hutchinson) or m (hutchpp, accounted as k = m // 3); default {DEFAULT_PROBES}.",
    ),
    method: str = typer.Option("pld", "--method", help="pld (default) or rdp (exact clipping only)."),
    rtol: float = typer.Option(1e-3, "--rtol", help="Relative tolerance of the σ bisection."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Print ε for a DP-SGD run (Poisson rate, σ, steps), or the smallest σ reaching --target-epsilon."""
    from privlm.norm_modes import CLIPPING_KINDS, clipping_spec
    from privlm.privacy.accountant import DEFAULT_DISCRETIZATION
    from privlm.privacy.calibration import calibrate_noise_multiplier, dpsgd_epsilon
    from privlm.privacy.events import PoissonGaussianStep
    from privlm.privacy.validation import (
        check_count,
        check_delta,
        check_epsilon,
        check_noise_multiplier,
        check_sample_rate,
    )

    check_sample_rate(sample_rate, "--sample-rate")
    check_count(steps, "--steps")
    check_delta(delta, "--delta")
    if (noise_multiplier is None) == (target_epsilon is None):
        raise UserError("give exactly one of --noise-multiplier and --target-epsilon")
    if noise_multiplier is not None:
        check_noise_multiplier(noise_multiplier, "--noise-multiplier")
    if target_epsilon is not None:
        check_epsilon(target_epsilon, "--target-epsilon")
    if probes is not None:
        check_count(probes, "--probes")
    if clipping is not None:
        clipping_spec(clipping, "--clipping")
    if clipping == "exact" and probes is not None:
        raise UserError(f"--probes {probes} does not apply to --clipping exact")
    if method not in ("pld", "rdp"):
        raise UserError(f"--method must be pld or rdp, got {method!r}")
    kinds = (clipping,) if clipping is not None else CLIPPING_KINDS
    if method == "rdp" and kinds != ("exact",):
        raise UserError("--method rdp only supports --clipping exact (randomized clipping needs pld)")
    chosen_probes = {kind: None if kind == "exact" else (probes or DEFAULT_PROBES) for kind in kinds}
    for kind in kinds:  # validates probes (e.g. hutchpp needs m >= 3) before any long computation
        PoissonGaussianStep(sample_rate, noise_multiplier or 1.0, kind, chosen_probes[kind])

    results: dict[str, float] = {}
    verb = "calibrating σ" if target_epsilon is not None else "accounting ε"
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=json_output,
    ) as progress:
        task = progress.add_task(verb, total=len(kinds))
        for kind in kinds:
            progress.update(task, description=f"{verb} ({kind})")
            if target_epsilon is not None:
                results[kind] = calibrate_noise_multiplier(
                    target_epsilon,
                    delta,
                    sample_rate,
                    steps,
                    kind,
                    chosen_probes[kind],
                    method,
                    rtol,
                    DEFAULT_DISCRETIZATION,
                )
            else:
                results[kind] = dpsgd_epsilon(
                    noise_multiplier,
                    sample_rate,
                    steps,
                    delta,
                    kind,
                    chosen_probes[kind],
                    method,
                    DEFAULT_DISCRETIZATION,
                )
            progress.advance(task)

    key = "noise_multiplier" if target_epsilon is not None else "epsilon"
    if json_output:
        shown = {kind: _json_number(value) for kind, value in results.items()}
        payload: dict[str, object] = {key: shown[kinds[0]] if len(kinds) == 1 else shown}
        payload.update(
            sample_rate=sample_rate,
            steps=steps,
            delta=delta,
            method=method,
            probes={kind: chosen_probes[kind] for kind in kinds},
        )
        if target_epsilon is not None:
            payload["target_epsilon"] = target_epsilon
        else:
            payload["noise_multiplier_input"] = noise_multiplier
        print_json(payload)
        return
    _print_table(results, chosen_probes, key, sample_rate, steps, delta, noise_multiplier, target_epsilon)


def _json_number(value: float) -> float | str:
    """Strict JSON has no Infinity: an unbounded ε (see privlm.privacy.randomized) is written as "inf"."""
    return value if math.isfinite(value) else "inf"


def _print_table(
    results: dict[str, float],
    chosen_probes: dict[str, int | None],
    key: str,
    sample_rate: float,
    steps: int,
    delta: float,
    noise_multiplier: float | None,
    target_epsilon: float | None,
) -> None:
    from privlm.privacy.events import PoissonGaussianStep

    given = f"σ={noise_multiplier:g}" if noise_multiplier is not None else f"target ε={target_epsilon:g}"
    table = Table(title=f"DP-SGD, q={sample_rate:g}, {steps} steps, δ={delta:g}, {given}")
    table.add_column("clipping")
    table.add_column("probes", justify="right")
    table.add_column("envelope k", justify="right")
    table.add_column("σ" if key == "noise_multiplier" else "ε", justify="right")
    if "exact" in results and len(results) > 1:
        table.add_column("ratio to exact", justify="right")
    for kind, value in results.items():
        probes = chosen_probes[kind]
        k = None if probes is None else PoissonGaussianStep(sample_rate, 1.0, kind, probes).envelope_probes
        row = [kind, "-" if probes is None else str(probes), "-" if k is None else str(k), f"{value:.4f}"]
        if "exact" in results and len(results) > 1:
            row.append(f"{value / results['exact']:.4f}")
        table.add_row(*row)
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add ``privlm account``."""
    app.command("account")(account)
