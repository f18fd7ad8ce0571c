"""``privlm demo``: both capabilities of privlm on one pass over a private set, in minutes.

DP fine-tuning (head-only, on the cached features) beside the untrained model and the non-private
fine-tune, and DP synthetic text (GRADMM generate–select) beside its noise-only control, zero-shot text
and a random real subset; every accuracy with its interval, the composed privacy of both releases, and
``report.html`` / ``report.png`` in the demo folder. See :mod:`privlm.experiments.demo` for what runs and
what each number means. A second run reuses the cached pass and the saved releases: it spends no new ε.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import typer
from rich.panel import Panel
from rich.table import Table

from privlm.cli._common import console, err_console, print_json
from privlm.cli._progress import cli_progress
from privlm.cli.models import load_with_status
from privlm.names import DEFAULT_MODEL
from privlm.resources.cache import cache_root

DEFAULTS = {  # mirrors privlm.experiments.demo.DemoSettings (imported lazily: `privlm --help` stays fast)
    "data": "rotten-tomatoes",
    "private_rows": 4000,
    "test_rows": 500,
    "per_class": 20,
    "finetune_epsilon": 1.0,
    "synth_epsilon": 3.0,
    "delta": 1e-5,
}


def default_out(model: str, data: str) -> Path:
    """``<cache>/demo/<model>--<data>/`` (names made file-system safe)."""
    return cache_root() / "demo" / re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}--{data}")


def demo(
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, local folder or hub id."),
    data: str = typer.Option(DEFAULTS["data"], help="A built-in data set (its train split is the private set)."),
    private_rows: int = typer.Option(DEFAULTS["private_rows"], "--private-rows", help="Private examples used."),
    test_rows: int = typer.Option(DEFAULTS["test_rows"], "--test-rows", help="Test examples scored."),
    per_class: int = typer.Option(DEFAULTS["per_class"], "--per-class", help="Synthetic examples per class."),
    finetune_epsilon: float = typer.Option(
        DEFAULTS["finetune_epsilon"], "--finetune-epsilon", help="ε of the DP fine-tune."
    ),
    synth_epsilon: float = typer.Option(
        DEFAULTS["synth_epsilon"], "--synth-epsilon", help="ε of the DP synthetic set (GRADMM's release)."
    ),
    delta: float = typer.Option(DEFAULTS["delta"], "--delta", help="δ of both releases together (half each)."),
    out: Path | None = typer.Option(None, "--out", help="Demo folder (default: in the privlm cache)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """DP fine-tuning and DP synthetic text on one pass over a private set, each read against its controls,
    with the composed privacy of both; writes report.html and report.png into the demo folder."""
    from privlm.experiments.demo import DemoSettings, cuts, run_demo
    from privlm.experiments.demo_report import accuracy_text, reading, table_rows, write_report

    start = time.perf_counter()
    settings = DemoSettings(
        model=model,
        data=data,
        private_rows=private_rows,
        test_rows=test_rows,
        per_class=per_class,
        finetune_epsilon=finetune_epsilon,
        synth_epsilon=synth_epsilon,
        delta=delta,
    )
    out = out if out is not None else default_out(model, data)
    cut = cuts(settings)
    if not as_json:
        console.print(
            Panel.fit(
                f"model [bold]{model}[/], private data [bold]{data}[/] (train split), folder {out}\n"
                "1. one forward pass over the private set (features shared by both private steps)\n"
                f"2. DP fine-tune of the label-word head (ε = {finetune_epsilon:g}) beside the untrained model "
                "and the non-private fine-tune\n"
                f"3. DP synthetic text with GRADMM (ε = {synth_epsilon:g}) beside its noise-only control, "
                "zero-shot text and a random real subset\n"
                "4. a head-only classifier on every training set, scored on the same test sentences\n"
                "cut to fit minutes: " + "; ".join(cut),
                title=f"privlm demo: ε = {finetune_epsilon:g} + {synth_epsilon:g}, δ = {delta:g}",
            )
        )
    loaded, tokenizer, model_facts = load_with_status(model)
    with cli_progress(err_console) as progress:
        report = run_demo(settings, loaded, tokenizer, out, progress)
    html_path, png_path = write_report(report, out)
    report.update(
        model=model_facts,
        cuts=cut,
        report_html=str(html_path),
        report_png=str(png_path),
        total_wall_s=round(time.perf_counter() - start, 1),
    )
    if as_json:
        print_json(report)
        return
    table = Table(title=f"test accuracy (n_test = {report['finetune']['dp']['n_test']})")
    for col in ("", "training set", "ε", "examples", "accuracy (95% CI)"):
        table.add_column(col)
    last = None
    for group, label, eps, n, scores in table_rows(report):
        table.add_row(group if group != last else "", label, eps, n, accuracy_text(scores))
        last = group
    console.print(table)
    for line in reading(report):
        console.print(line)
    stages = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in report["stages"].items())
    console.print(f"stages: {stages}; total {report['total_wall_s']:.0f} s. Report: {html_path}")
    console.print(
        "not covered by the (ε, δ) statement: the non-private references (they train on the private data "
        "directly), the test scores (the test split is scored directly) and the wall times"
    )


def register(app: typer.Typer) -> None:
    """Add ``privlm demo``."""
    app.command("demo")(demo)
