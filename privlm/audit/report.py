"""The audit's results folder: ``audit.json`` (every cell), ``README.md`` (the table) and
``lower_bound.png`` (lower bound against accounted ε, one line per mechanism and mode)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from privlm.atomic import atomic_path, write_text_atomic

TABLE_HEADER = (
    "| mechanism | mode | target ε | accounted ε | lower bound, this cell (95 %) | lower bound, family-wise | "
    "guesses (correct) | canaries | ceiling, family-wise | verdict | wall time |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|\n"
)


def verdict_text(row: dict) -> str:
    """``VIOLATION``, ``cannot detect a violation`` (the ceiling is not above the claim) or ``consistent``."""
    if row["violation"]:
        return "**VIOLATION**"
    return "cannot detect a violation" if not row["detectable"] else "consistent"


def table(rows: Sequence[dict]) -> str:
    """The Markdown table of the grid (a violation is marked in bold)."""
    lines = []
    for r in rows:
        lines.append(
            f"| {r['mechanism']} | {r['mode']} | {r['epsilon']:g} | {r['accounted_epsilon']:.3f} | "
            f"{r['epsilon_lower_bound']:.3f} | {r['family_lower_bound']:.3f} | {r['guesses']} ({r['correct']}) | "
            f"{r['canaries']} | {r['family_ceiling']:.2f} | {verdict_text(r)} | {r['seconds']:.1f} s |"
        )
    return TABLE_HEADER + "\n".join(lines) + "\n"


def summary(rows: Sequence[dict]) -> str:
    """Two sentences on the grid: its family-wise level, and the cells that cannot detect a violation."""
    k = rows[0]["family_size"] if rows else 0
    blind = [r for r in rows if not r["detectable"]]
    text = (
        f"The grid tests {k} claims together: each verdict is decided at level "
        f"{1 - rows[0]['family_confidence'] if rows else 0.05:g}/{k} (Bonferroni), so a correct "
        "implementation shows a VIOLATION anywhere in the grid with probability at most 5 %. "
    )
    if blind:
        text += (
            f"{len(blind)} of {len(rows)} cells cannot detect a violation: with their canaries, even "
            "all-correct guesses give a bound at or below the accounted ε (their ceiling). They show the "
            "mechanism runs; they are no evidence about its ε."
        )
    else:
        text += "Every cell could detect a violation (its ceiling is above its accounted ε)."
    return text


def plot(rows: Sequence[dict], path: Path) -> None:
    """Lower bound against accounted ε per (mechanism, mode), with the y = x line (the claim)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)  # one colour per line (up to 20)
    series: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        series.setdefault((r["mechanism"], r["mode"]), []).append(r)
    top = max([r["accounted_epsilon"] for r in rows] + [1.0])
    ax.plot([0, top], [0, top], color="grey", linestyle="--", label="lower bound = accounted ε")
    for m, ceiling in sorted({(r["canaries"], r["family_ceiling"]) for r in rows}):
        ax.axhline(ceiling, color="grey", linestyle=":", linewidth=1)
        ax.annotate(f"family-wise ceiling, {m} canaries", (0, ceiling), fontsize=7, va="bottom", color="grey")
    for (mechanism, mode), points in series.items():
        points = sorted(points, key=lambda r: r["accounted_epsilon"])
        ax.plot(
            [p["accounted_epsilon"] for p in points],
            [p["family_lower_bound"] for p in points],
            marker="o",
            label=f"{mechanism} ({mode})",
        )
    ax.set_xlabel("accounted ε (δ = {:g})".format(rows[0]["delta"]))
    ax.set_ylabel("one-run lower bound on ε (family-wise 95 %)")
    ax.set_title("privlm audit: empirical lower bound vs accounted ε")
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def write_results(rows: Sequence[dict], out: Path, command: str) -> None:
    """Write ``audit.json``, ``README.md`` and ``lower_bound.png`` under ``out``."""
    write_text_atomic(
        out / "audit.json", json.dumps({"command": command, "cells": list(rows)}, indent=2, sort_keys=True)
    )
    plot(rows, out / "lower_bound.png")
    readme = (
        "# privlm audit: one-run lower bounds on ε\n\n"
        f"Command: `{command}`\n\n"
        "Each row: the mechanism run once with m canaries (each included with probability ½), the "
        "lower bound on ε that the correct guesses give (Steinke, Nasr, Jagielski 2023; best of the fixed "
        "guess counts, Bonferroni-corrected), and the ε the mechanism's accountant claims. *This cell*: the "
        "bound at 95 % for the cell alone. *Family-wise*: the bound at the level that keeps the whole grid's "
        "chance of a false alarm at 5 %; the verdict uses it. *Ceiling*: the family-wise bound had every "
        "guess been right — no audit of this size can show more, however leaky the mechanism (dotted lines "
        "in the plot); where it is not above the accounted ε the cell *cannot detect a violation*. A lower "
        "bound is evidence, not a measurement of ε: it says the mechanism is *at least* that leaky; a bound "
        "above the accounted ε would prove the implementation wrong. Runs are seeded (reproducible, but for "
        "GRADMM's release and PE's histograms, which draw their own OS noise keys), so none of them is a "
        "private release. Each cell under `cells/` is keyed by a hash of the code it ran (its mechanism's "
        "modules and the bound's), the library versions, its scale, δ and seed: a rerun with the same "
        "`--out` reuses a cell only if all of these are unchanged. The canaries, the broken mechanisms the "
        "audit catches and what it cannot catch: `docs/auditing.md` in the privlm repository.\n\n"
        + summary(rows)
        + "\n\n"
        + table(rows)
        + "\n![lower bound vs accounted ε](lower_bound.png)\n"
    )
    write_text_atomic(out / "README.md", readme)
