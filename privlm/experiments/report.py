"""Experiment report: ``report.md`` (with ``plots/*.png``) and a self-contained ``report.html``.

Per (method, ε, n per class): mean and standard deviation of test accuracy over seeds, the mean of the
per-seed 95% bootstrap bounds, the head-only classifier's accuracy beside it when the grid ran it
(``head_probe``), and the mean membership-inference advantage and AUC. Plots: accuracy
vs n per method, and accuracy vs ε for the methods that take ε. For every ε-method, ε and n, the
report says whether it beats the best baseline at that n (``full-pool`` is a reference, not a baseline),
and every DP entry of a method with a noise-only control in the grid (a table of the same base method with
the same parameters plus ``noise_only = true``) is read against that control at the same ε and n: the
difference is what the private data contributed. "Privacy of the grid" states what publishing every DP
cell's set together would cost (:mod:`privlm.experiments.grid_privacy`).
"""

from __future__ import annotations

import base64
import html
import io
import os
import platform
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from privlm.atomic import write_bytes_atomic, write_text_atomic  # noqa: E402
from privlm.experiments.config import FULL_POOL, WHOLE_SPLIT, ExperimentConfig, base_name  # noqa: E402
from privlm.experiments.grid_privacy import grid_privacy  # noqa: E402
from privlm.synthesis.registry import get_method  # noqa: E402


def _label(method: str, epsilon: float | None, takes_epsilon: bool) -> str:
    if not takes_epsilon:
        return method
    return f"{method} (no DP)" if epsilon is None else f"{method} (ε={epsilon:g})"


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (method, ε, n): accuracy mean/std over seeds, mean CI bounds, mean MIA scores."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["method"], row["epsilon"], row["n_per_class"])].append(row)
    summary = []
    for (method, epsilon, n), group in groups.items():
        acc = np.array([r["accuracy"] for r in group])
        entry = {
            "method": method,
            "epsilon": epsilon,
            "n_per_class": n,
            "seeds": len(group),
            "label": _label(method, epsilon, get_method(method).takes_epsilon),
            "accuracy_mean": float(acc.mean()),
            "accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
            "ci_low_mean": float(np.mean([r["ci_low"] for r in group])),
            "ci_high_mean": float(np.mean([r["ci_high"] for r in group])),
            "n_train_mean": float(np.mean([r["n_train"] for r in group])),
            # the rows' privacy text; when they differ (an older row carries an older wording of the method's
            # text), the one the method gives now, which is what a rerun of those rows would record
            "privacy": group[0]["privacy"] if len({r["privacy"] for r in group}) == 1 else get_method(method).privacy,
            "wall_time_s": float(sum(r["wall_time_s"] for r in group)),
        }
        for key in ("mia_advantage", "mia_auc"):
            if all(key in r for r in group):
                entry[key] = float(np.mean([r[key] for r in group]))
        if all("head_accuracy" in r for r in group):
            head = np.array([r["head_accuracy"] for r in group])
            entry["head_accuracy_mean"] = float(head.mean())
            entry["head_accuracy_std"] = float(head.std(ddof=1)) if len(head) > 1 else 0.0
        summary.append(entry)
    return summary


def verdicts(summary: Sequence[dict[str, Any]]) -> list[str]:
    """For every ε-method entry: does it beat the best baseline (the methods without ε, not full-pool) at its
    n? Compared by mean accuracy over seeds; a line says when the two mean 95% intervals overlap."""
    lines = []
    for entry in summary:
        if not get_method(entry["method"]).takes_epsilon:
            continue
        rivals = [
            e
            for e in summary
            if e["n_per_class"] == entry["n_per_class"]
            and base_name(e["method"]) != FULL_POOL
            and not get_method(e["method"]).takes_epsilon
        ]
        if not rivals:
            continue
        best = max(rivals, key=lambda e: e["accuracy_mean"])
        beats = entry["accuracy_mean"] > best["accuracy_mean"]
        lo, hi = sorted((entry, best), key=lambda e: e["accuracy_mean"])
        overlap = lo["ci_high_mean"] >= hi["ci_low_mean"]
        lines.append(
            f"n={entry['n_per_class']}: {entry['label']} {entry['accuracy_mean']:.1%} "
            f"{'beats' if beats else 'does NOT beat'} the best baseline, {best['label']} {best['accuracy_mean']:.1%}"
            + (" (within noise: the mean 95% intervals overlap)." if overlap else ".")
        )
    return lines


def _controls(config: ExperimentConfig) -> dict[str, str]:
    """Each method's noise-only control: the table with the same base method and parameters plus ``noise_only``."""
    params = {m.name: m.params for m in config.methods}
    return {
        name: control
        for name in params
        for control, p in params.items()
        if p.get("noise_only")
        and not params[name].get("noise_only")
        and base_name(name) == base_name(control)
        and {k: v for k, v in p.items() if k != "noise_only"} == params[name]
    }


def against_noise(summary: Sequence[dict[str, Any]], config: ExperimentConfig) -> list[str]:
    """For each DP entry (ε given) of a method with a noise-only control: its mean accuracy minus the control's
    at the same ε and n, and minus the same method without DP."""
    controls = _controls(config)
    lines = []
    for entry in summary:
        if entry["epsilon"] is None or entry["method"] not in controls:
            continue
        same = [
            e
            for e in summary
            if e["n_per_class"] == entry["n_per_class"]
            and e["epsilon"] == entry["epsilon"]
            and e["method"] == controls[entry["method"]]
        ]
        no_dp = [
            e
            for e in summary
            if e["n_per_class"] == entry["n_per_class"] and e["epsilon"] is None and e["method"] == entry["method"]
        ]
        for control in same:
            diff = entry["accuracy_mean"] - control["accuracy_mean"]
            line = (
                f"n={entry['n_per_class']}: {entry['label']} {entry['accuracy_mean']:.1%} vs noise-only "
                f"{control['label']} {control['accuracy_mean']:.1%}: {100 * diff:+.1f} points from the private data "
                f"({entry['seeds']} and {control['seeds']} seeds)"
            )
            if no_dp:
                line += f"; {100 * (entry['accuracy_mean'] - no_dp[0]['accuracy_mean']):+.1f} points vs no DP"
            if "head_accuracy_mean" in entry and "head_accuracy_mean" in control:
                line += (
                    f"; head-only classifier {entry['head_accuracy_mean']:.1%} vs {control['head_accuracy_mean']:.1%}: "
                    f"{100 * (entry['head_accuracy_mean'] - control['head_accuracy_mean']):+.1f} points"
                )
            lines.append(line + ".")
    return lines


def figure_png(fig: plt.Figure) -> bytes:
    """``fig`` as PNG bytes (closed afterwards)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def plot_accuracy_vs_n(summary: Sequence[dict[str, Any]]) -> bytes:
    """Accuracy (mean ± std over seeds) against n per class, one line per method and ε."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in dict.fromkeys(e["label"] for e in summary):
        points = sorted((e for e in summary if e["label"] == label), key=lambda e: e["n_per_class"])
        if base_name(points[0]["method"]) == FULL_POOL:
            ax.axhline(
                points[0]["accuracy_mean"],
                color="black",
                linestyle="--",
                label=f"{label} (n={points[0]['n_per_class']})",
            )
            continue
        ax.errorbar(
            [e["n_per_class"] for e in points],
            [e["accuracy_mean"] for e in points],
            yerr=[e["accuracy_std"] for e in points],
            marker="o",
            capsize=3,
            label=label,
        )
    ax.set_xticks(sorted({e["n_per_class"] for e in summary if base_name(e["method"]) != FULL_POOL}))
    ax.set_xlabel("training examples per class (n)")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return figure_png(fig)


def plot_accuracy_vs_epsilon(summary: Sequence[dict[str, Any]]) -> bytes | None:
    """Accuracy against ε (log scale) for ε-methods, one line per method and n; no-DP drawn at the right."""
    entries = [e for e in summary if get_method(e["method"]).takes_epsilon]
    if not entries or all(e["epsilon"] is None for e in entries):
        return None
    finite = [e["epsilon"] for e in entries if e["epsilon"] is not None]
    no_dp_x = max(finite) * 10
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in dict.fromkeys(e["method"] for e in entries):
        for n in sorted({e["n_per_class"] for e in entries if e["method"] == method}):
            points = [e for e in entries if e["method"] == method and e["n_per_class"] == n]
            points.sort(key=lambda e: no_dp_x if e["epsilon"] is None else e["epsilon"])
            xs = [no_dp_x if e["epsilon"] is None else e["epsilon"] for e in points]
            ax.errorbar(
                xs,
                [e["accuracy_mean"] for e in points],
                yerr=[e["accuracy_std"] for e in points],
                marker="o",
                capsize=3,
                label=f"{method}, n={n}",
            )
    ax.set_xscale("log")
    ticks = sorted(set(finite))
    has_no_dp = any(e["epsilon"] is None for e in entries)
    ax.set_xticks(ticks + [no_dp_x] * has_no_dp, [f"{t:g}" for t in ticks] + ["no DP"] * has_no_dp)
    ax.minorticks_off()
    ax.set_xlabel("ε (δ fixed)")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return figure_png(fig)


def _table(summary: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The report's table; a "head-only" column (the head-only classifier's accuracy beside the fine-tune's)
    when the grid ran it."""
    probed = any("head_accuracy_mean" in e for e in summary)
    head = [
        "method",
        "n/class",
        "train size",
        "seeds",
        "accuracy (mean ± sd)",
        "95% CI (mean)",
        *(["head-only (mean ± sd)"] if probed else []),
        "MIA adv.",
        "MIA AUC",
        "wall s",
        "privacy",
    ]
    body = []
    for e in sorted(summary, key=lambda e: (e["n_per_class"], -e["accuracy_mean"])):
        body.append(
            [
                e["label"],
                str(e["n_per_class"] or WHOLE_SPLIT),
                f"{e['n_train_mean']:.1f}".removesuffix(".0"),
                str(e["seeds"]),
                f"{e['accuracy_mean']:.1%} ± {e['accuracy_std']:.1%}",
                f"{e['ci_low_mean']:.1%}–{e['ci_high_mean']:.1%}",
                *(
                    [
                        f"{e['head_accuracy_mean']:.1%} ± {e['head_accuracy_std']:.1%}"
                        if "head_accuracy_mean" in e
                        else "–"
                    ]
                    if probed
                    else []
                ),
                f"{e['mia_advantage']:.3f}" if "mia_advantage" in e else "–",
                f"{e['mia_auc']:.3f}" if "mia_auc" in e else "–",
                f"{e['wall_time_s']:.0f}",
                e["privacy"],
            ]
        )
    return head, body


def write_report(
    out: str | Path,
    rows: Sequence[dict[str, Any]],
    config: ExperimentConfig,
    *,
    total_cells: int | None = None,
    command: str | None = None,
) -> None:
    """Write ``report.md``, ``plots/*.png`` and ``report.html`` (images embedded) into ``out``;
    ``total_cells`` (the grid's size) makes an unfinished grid say so, ``command`` is quoted."""
    out = Path(out)
    summary = summarize(rows)
    plots = {"accuracy_vs_n": plot_accuracy_vs_n(summary), "accuracy_vs_epsilon": plot_accuracy_vs_epsilon(summary)}
    plots = {name: png for name, png in plots.items() if png is not None}
    for name, png in plots.items():  # a temporary file of its own: the grid's processes may write at once
        write_bytes_atomic(out / "plots" / f"{name}.png", png)
    total = sum(r["wall_time_s"] for r in rows)
    unfinished = total_cells not in (None, len(rows))
    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}"
    facts = [
        f"model `{config.model}`, dataset `{config.data_spec()}`, private pool "
        + ("the whole train split" if config.pool_per_class == WHOLE_SPLIT else f"{config.pool_per_class} per class")
        + ", "
        f"n per class {list(config.n_per_class)}, seeds {list(config.seeds)}, δ={config.delta:g}",
        f"config hash `{config.hash}`; {len(rows)} cells"
        + (f" of {total_cells} (UNFINISHED: the other cells are not run yet)" if unfinished else "")
        + f"; sum of cell wall times {total:.0f} s ({total / 3600:.2f} h)",
        f"machine: {machine}",
        *([f"command: `{command}`"] if command else []),
        f"fine-tuning: {config.finetune}; test examples: {rows[0]['n_test'] if rows else 0}",
        *([f"head-only classifier: {config.head_probe_config()}"] if config.head_probe is not None else []),
    ]
    head, body = _table(summary)
    found = verdicts(summary)
    noise = against_noise(summary, config)
    spent = [grid_privacy(out, rows, config.delta).statement()]
    md = [
        "# Experiment report",
        "",
        *[f"- {f}" for f in facts],
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    md += ["| " + " | ".join(r) + " |" for r in body]
    verdict_title = "Against the best baseline" + (" (PROVISIONAL: the grid is unfinished)" if unfinished else "")
    if found:
        md += ["", f"## {verdict_title}", "", *[f"- {line}" for line in found]]
    noise_title = "Against the noise-only control" + (" (PROVISIONAL: the grid is unfinished)" if unfinished else "")
    if noise:
        md += ["", f"## {noise_title}", "", *[f"- {line}" for line in noise]]
    md += ["", "## Privacy of the grid", "", *spent]
    md += ["", *[f"![{name}](plots/{name}.png)" for name in plots], ""]
    write_text_atomic(out / "report.md", "\n".join(md))
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
    images = "".join(
        f'<h2>{name}</h2><img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for name, png in plots.items()
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>privlm experiment report</title>"
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}td,th{border:1px solid #ccc;"
        "padding:3px 6px;font-size:13px}table{border-collapse:collapse}</style></head><body>"
        "<h1>Experiment report</h1><ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in facts) + "</ul>"
        "<table><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>"
        + cells
        + "</table>"
        + "".join(
            f"<h2>{html.escape(title)}</h2><ul>" + "".join(f"<li>{html.escape(v)}</li>" for v in lines) + "</ul>"
            for title, lines in ((verdict_title, found), (noise_title, noise), ("Privacy of the grid", spent))
            if lines
        )
        + images
        + "</body></html>"
    )
    write_text_atomic(out / "report.html", page)
