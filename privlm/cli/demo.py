"""``privlm demo``: DP synthetic text (GRADMM, ε = 4, δ = 1e-5) from rotten-tomatoes with SmolLM2-135M.

Runs the ``demo`` preset (minutes on 2 CPU cores) and prints the synthetic examples beside the privacy
they cost. Output goes to the privlm cache (``demo/<model>--<data>/synthetic.jsonl``) unless ``--out``
is given; a second run reuses the saved DP release and finished batches (``--resume`` semantics), so it
spends no further privacy budget and prints the same examples.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import typer
from rich.panel import Panel

from privlm.cli._common import console, print_json
from privlm.cli.models import load_with_status
from privlm.cli.synth import check_privacy_args, show_result, summary, synthesize_with_progress
from privlm.gradmm.config import make_config
from privlm.resources.cache import cache_root
from privlm.resources.datasets import DEFAULT_DATASET, load_dataset
from privlm.resources.models import DEFAULT_MODEL

DEMO_EPSILON = 4.0
DEMO_DELTA = 1e-5
PLAN = (
    "release a differentially private per-class gradient of the model's last layer on the train split",
    "generate readable synthetic examples whose gradient matches the release (GRADMM)",
    "filter them by few-shot label agreement and matching loss; print them beside the privacy spent",
)


def default_out(model: str, data: str) -> Path:
    """``<cache>/demo/<model>--<data>/synthetic.jsonl`` (names made file-system safe)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}--{data}")
    return cache_root() / "demo" / slug / "synthetic.jsonl"


def demo(
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, local folder or hub id."),
    data: str = typer.Option(DEFAULT_DATASET, help="Private dataset: name, jsonl:PATH or csv:PATH."),
    per_class: int = typer.Option(10, "--per-class", help="Synthetic examples per class."),
    epsilon: float = typer.Option(DEMO_EPSILON, "--epsilon", help="Privacy budget of the whole output."),
    delta: float = typer.Option(DEMO_DELTA, "--delta"),
    out: Path | None = typer.Option(None, "--out", help="Output JSONL (default: in the privlm cache)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Release a DP last-layer gradient of the private train split, then generate and filter synthetic text."""
    check_privacy_args(epsilon, delta, no_dp=False)
    start = time.perf_counter()
    config = make_config("demo")
    out = out if out is not None else default_out(model, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    loaded, tokenizer, model_facts = load_with_status(model)
    dataset = load_dataset(data)
    data_facts = {
        "name": data,
        "num_examples": len(dataset),
        "split_sizes": dataset.split_sizes,
        "verbalizer": dataset.verbalizer.to_dict(),
        "private_examples_per_class": config.private_per_class,
    }
    if not as_json:
        console.print(Panel.fit(
            f"model [bold]{model}[/]: {model_facts['architecture']}, {model_facts['parameters']:,} parameters\n"
            f"private data [bold]{data}[/] (train split, up to {config.private_per_class} per class)\n"
            + "\n".join(f"{i}. {line}" for i, line in enumerate(PLAN, start=1)),
            title=f"privlm demo: (ε={epsilon:g}, δ={delta:g})-DP synthetic text",
        ))
    result, _ = synthesize_with_progress(
        loaded, tokenizer, model_name=model, data=data, per_class=per_class, config=config, dp=True,
        epsilon=epsilon, delta=delta, out=out, resume=True,
    )
    wall_s = time.perf_counter() - start
    if as_json:
        print_json({"model": model_facts, "data": data_facts, "plan": list(PLAN), **summary(result, out, wall_s)})
    else:
        show_result(result, out, wall_s)


def register(app: typer.Typer) -> None:
    """Add ``privlm demo``."""
    app.command("demo")(demo)
