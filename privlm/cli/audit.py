"""``privlm audit``: one-run lower bounds on ε for privlm's mechanisms; exit 1 on a violation."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from privlm.audit.registry import MECHANISMS, default_names
from privlm.errors import UserError

_MECHANISM_HELP = "Comma-separated: " + ", ".join(f"{m.name} ({m.summary})" for m in MECHANISMS.values()) + "."


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def _numbers(text: str, option: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError as err:
        raise UserError(f"{option} must be numbers separated by commas, got {text!r}") from err


def audit(
    mechanisms: str = typer.Option(",".join(default_names()), "--mechanisms", help=_MECHANISM_HELP),
    modes: str | None = typer.Option(
        None,
        "--modes",
        help="Norm modes (exact, mixed, hutchinson, hutchpp), GRADMM rows (label-rows, full) or PE's histograms; default: all of each mechanism.",
    ),
    epsilons: str = typer.Option("1,4,8", "--epsilons", help="Target ε values, comma-separated."),
    delta: float = typer.Option(1e-5, "--delta", help="δ of the claim and of the bound."),
    canaries: int | None = typer.Option(
        None, "--canaries", help="Canaries per DP-SGD cell (default 1000; --quick 200)."
    ),
    steps: int | None = typer.Option(None, "--steps", help="DP-SGD steps per cell (default 50; --quick 10)."),
    canary_norm: float | None = typer.Option(
        None, "--canary-norm", help="Norm of the white-box gradient canaries in units of C (>= 1; default 2)."
    ),
    quick: bool = typer.Option(False, "--quick", help="Small cells (seconds each): a smoke audit."),
    seed: int = typer.Option(0, "--seed", help="Seed of canaries and of the (non-private) audit runs."),
    out: Path | None = typer.Option(
        None, "--out", help="Results folder (audit.json, README.md, lower_bound.png, cells/)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
) -> None:
    """Audit privlm's mechanisms: insert canaries, run once, and report a lower bound on ε next to the
    accounted ε (95 % per cell and family-wise over the grid). Exits 1, naming the mechanism, if a
    family-wise lower bound exceeds its accounted ε. With --out, a cell is reused only if its code,
    libraries, scale, δ and seed are unchanged."""
    from dataclasses import replace

    from privlm.audit.report import table, write_results
    from privlm.audit.runner import QUICK, Scale, grid, run_grid, violations
    from privlm.cli._common import console, err_console, print_json
    from privlm.privacy.validation import check_count, check_delta

    check_delta(delta, "--delta")
    scale = QUICK if quick else Scale()
    if canaries is not None:
        check_count(canaries, "--canaries")
        if canaries < 2:
            raise UserError(f"--canaries must be >= 2, got {canaries}")
        scale = replace(scale, canaries=canaries)
    if canary_norm is not None:
        if not (canary_norm >= 1.0 and canary_norm < float("inf")):
            raise UserError(f"--canary-norm must be a finite number >= 1, got {canary_norm}")
        scale = replace(scale, canary_norm=canary_norm)
    if steps is not None:
        check_count(steps, "--steps")
        scale = replace(scale, steps=steps)
    cells = grid(_names(mechanisms) or [], _names(modes), _numbers(epsilons, "--epsilons"))
    if not cells:
        raise UserError("nothing to audit: --mechanisms is empty")

    def show(row: dict) -> None:
        if not json_output:
            err_console.log(
                f"{row['mechanism']} {row['mode']} ε={row['epsilon']:g}: lower bound "
                f"{row['epsilon_lower_bound']:.3f}, family-wise {row['family_lower_bound']:.3f} "
                f"(accounted {row['accounted_epsilon']:.3f})"
            )

    rows = run_grid(cells, scale, delta, seed, None if out is None else out / "cells", show)
    if out is not None:
        write_results(
            rows, out, "privlm audit " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["audit"] else sys.argv[1:])
        )
    if json_output:
        print_json(rows)
    else:
        console.print(table(rows))
    broken = violations(rows)
    for line in broken:
        err_console.print(f"VIOLATION: {line}")
    if broken:
        sys.exit(1)  # not typer.Exit: privlm.cli.main runs click with standalone_mode=False, which returns its code


def register(app: typer.Typer) -> None:
    """Add ``privlm audit``."""
    app.command("audit")(audit)
