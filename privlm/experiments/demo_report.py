"""The demo's closing table, the paragraph that reads it, and the same as ``report.html`` + ``report.png``.

Everything here is post-processing of :func:`privlm.experiments.demo.run_demo`'s report: accuracies on
the test subset, the DP releases' privacy statement, and the examples of the DP and public sets (never a
private text: the random real subset is scored, not shown).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from privlm.atomic import write_bytes_atomic, write_text_atomic
from privlm.experiments.report import figure_png

FINETUNE_ROWS = (  # (report key, label, how its ε is shown)
    ("untrained", "untrained model (zero-shot label words)", "0"),
    ("dp", "DP fine-tune", "finetune"),
    ("non_private", "non-private fine-tune (same recipe)", "∞"),
)
SYNTH_ROWS = (
    ("gradmm", "DP synthetic: GRADMM", "synth"),
    ("noise_only", "noise-only control (GRADMM, pure-noise release)", "0"),
    ("zero_shot", "zero-shot synthetic text (public model)", "0"),
    ("random_real", "random real subset (non-private)", "∞"),
)


def table_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str, dict[str, Any] | None]]:
    """``(group, training set, ε, examples, scores)`` per row of the closing table, in display order."""
    settings = report["settings"]
    eps = {"finetune": f"{settings['finetune_epsilon']:g}", "synth": f"{settings['synth_epsilon']:g}"}
    rows = []
    n_private = report["finetune"]["n_private"]
    for key, label, shown in FINETUNE_ROWS:
        examples = "–" if key == "untrained" else str(n_private)
        rows.append(("fine-tuning", label, eps.get(shown, shown), examples, report["finetune"][key]))
    for key, label, shown in SYNTH_ROWS:
        scores = report["synthetic"][key]
        rows.append(("synthetic", label, eps.get(shown, shown), str(scores["n_train"]), scores))
    return rows


def accuracy_text(scores: dict[str, Any] | None) -> str:
    """``0.843 (0.812–0.874)``, or a dash for a set that kept no example."""
    if scores is None or scores.get("accuracy") is None:
        return "– (no examples kept)"
    return f"{scores['accuracy']:.3f} ({scores['ci_low']:.3f}–{scores['ci_high']:.3f})"


def _points(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if a.get("accuracy") is None or b.get("accuracy") is None:
        return None
    return 100 * (a["accuracy"] - b["accuracy"])


def reading(report: dict[str, Any]) -> list[str]:
    """The closing paragraph, sentence by sentence: each DP result read against its controls."""
    settings, ft, syn = report["settings"], report["finetune"], report["synthetic"]
    privacy = report["privacy"]
    lines = []
    gap, gain = _points(ft["non_private"], ft["dp"]), _points(ft["dp"], ft["untrained"])
    lines.append(
        f"DP fine-tuning at ε = {settings['finetune_epsilon']:g} on {ft['n_private']:,} private sentences is "
        f"{abs(gap):.1f} points {'below' if gap >= 0 else 'above'} the same recipe without noise and "
        f"{gain:+.1f} points against the untrained model."
    )
    control, zero = _points(syn["gradmm"], syn["noise_only"]), _points(syn["gradmm"], syn["zero_shot"])
    real = _points(syn["random_real"], syn["gradmm"])
    if control is None:
        lines.append("GRADMM kept no synthetic example, so it is not compared.")
    else:
        lines.append(
            f"The DP synthetic set (ε = {settings['synth_epsilon']:g}, {syn['gradmm']['n_train']} examples) scores "
            f"{control:+.1f} points against its noise-only control (same candidates, a release of pure noise: what "
            f"the public model alone gives) and {zero:+.1f} against zero-shot text of the same size; a random real "
            f"subset of that size scores {real:+.1f} points against it. At this size the 95 % intervals are wide: "
            "read a difference inside them as no difference."
        )
    lines.append(
        f"Everything DP above together is (ε = {privacy['epsilon_composed_pld']:.3g}, δ = {privacy['delta']:g})-DP "
        f"(PLD composition of the two ledgers; basic composition gives ε = {privacy['epsilon_basic_composition']:g})."
        + (" This run reused the saved releases: no new privacy was spent." if not report["new_privacy_spent"] else "")
    )
    return lines


def plot(report: dict[str, Any]) -> bytes:
    """Test accuracy with 95 % intervals, one bar per training set (PNG)."""
    rows = [r for r in table_rows(report) if r[4] is not None and r[4].get("accuracy") is not None]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    colors = {"fine-tuning": "#3b75af", "synthetic": "#e08a2c"}
    for i, (group, _, _, _, s) in enumerate(rows):
        ax.barh(i, s["accuracy"], color=colors[group], alpha=0.85)
        ax.errorbar(
            s["accuracy"], i, xerr=[[s["accuracy"] - s["ci_low"]], [s["ci_high"] - s["accuracy"]]], color="black"
        )
    ax.set_yticks(range(len(rows)), [f"{label} (ε={eps})" for _, label, eps, _, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0.4, 1.0)
    ax.set_xlabel(f"test accuracy (n_test = {rows[0][4]['n_test'] if rows else 0}), 95 % interval")
    ax.set_title("privlm demo: DP fine-tuning (blue) and DP synthetic text (orange)", fontsize=10)
    return figure_png(fig)


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``out/report.png`` and a self-contained ``out/report.html`` (the PNG embedded); their paths."""
    png = plot(report)
    write_bytes_atomic(out / "report.png", png)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in (label, eps, n, accuracy_text(s))) + "</tr>"
        for _, label, eps, n, s in table_rows(report)
    )
    examples = "".join(
        f"<h3>{html.escape(name)}</h3><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in texts) + "</ul>"
        for name, texts in report["examples"].items()
    )
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in report["stages"].items())
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>privlm demo</title>"
        "<style>body{font-family:sans-serif;max-width:52em;margin:2em auto}td,th{padding:.2em .8em;"
        "border-bottom:1px solid #ddd;text-align:left}</style></head><body><h1>privlm demo</h1>"
        + "".join(f"<p>{html.escape(line)}</p>" for line in reading(report))
        + "<table><tr><th>training set</th><th>ε</th><th>examples</th><th>accuracy (95 % CI)</th></tr>"
        + body
        + "</table>"
        + f"<img alt='accuracy per training set' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        + "<h2>First synthetic examples (DP or public text)</h2>"
        + examples
        + f"<p>Stages: {html.escape(stages)}.</p></body></html>\n"
    )
    write_text_atomic(out / "report.html", page)
    return out / "report.html", out / "report.png"
