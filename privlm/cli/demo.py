"""``privlm demo``: DP synthetic text (GRADMM, ε = 4, δ = 1e-5) from rotten-tomatoes with SmolLM2-135M.

Runs the ``demo`` preset (minutes on 2 CPU cores) and prints the synthetic examples beside the privacy
they cost, then fine-tunes the model on the synthetic set and on a random real subset of the same size
(a non-private reference) and prints both test accuracies. Output goes to the privlm cache (``demo/<model>--<data>/synthetic.jsonl``) unless ``--out``
is given; a second run reuses the saved DP release and finished batches (``--resume`` semantics), so it
spends no further privacy budget and prints the same examples.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path

import typer
from rich.panel import Panel

from privlm.cli._common import LABELS_HELP, console, print_json
from privlm.cli.models import load_with_status
from privlm.cli.synth import SPLIT_SEED, check_privacy_args, show_result, summary, synthesize_with_progress
from privlm.errors import UserError
from privlm.evaluation.finetune_config import preset
from privlm.gradmm.config import make_config
from privlm.names import DEFAULT_MODEL
from privlm.resources.cache import cache_root
from privlm.resources.datasets import DEFAULT_DATASET, load_dataset


DEMO_EPSILON = 4.0
DEMO_DELTA = 1e-5
PLAN = (
    "release a differentially private per-class gradient of the model's last layer on the train split",
    "generate readable synthetic examples whose gradient matches the release (GRADMM)",
    "filter them by few-shot label agreement and matching loss; print them beside the privacy spent",
    "fine-tune on the synthetic set and on a random real subset of the same size; print both test accuracies",
)


def default_out(model: str, data: str) -> Path:
    """``<cache>/demo/<model>--<data>/synthetic.jsonl`` (names made file-system safe)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}--{data}")
    return cache_root() / "demo" / slug / "synthetic.jsonl"


def demo(
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, local folder or hub id."),
    data: str = typer.Option(DEFAULT_DATASET, help="Private dataset: name, jsonl:PATH or csv:PATH."),
    labels: str | None = typer.Option(None, "--labels", metavar="NAMES", help=LABELS_HELP),
    per_class: int = typer.Option(10, "--per-class", help="Synthetic examples per class."),
    epsilon: float = typer.Option(DEMO_EPSILON, "--epsilon", help="Privacy budget of the whole output."),
    delta: float = typer.Option(DEMO_DELTA, "--delta"),
    out: Path | None = typer.Option(None, "--out", help="Output JSONL (default: in the privlm cache)."),
    eval_test: int = typer.Option(
        200, "--eval-test", help="Test examples for the closing accuracy comparison (0 skips it)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Release a DP last-layer gradient of the private train split, then generate and filter synthetic text."""
    check_privacy_args(epsilon, delta, no_dp=False)
    if eval_test < 0:
        raise UserError(f"--eval-test must be >= 0 (got {eval_test})")
    start = time.perf_counter()
    config = make_config("demo")
    out = out if out is not None else default_out(model, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    loaded, tokenizer, model_facts = load_with_status(model)
    dataset = load_dataset(data, labels=labels)
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
            f"private data [bold]{data}[/] (train split, {config.private_per_class or 'all'} per class)\n"
            + "\n".join(f"{i}. {line}" for i, line in enumerate(PLAN, start=1)),
            title=f"privlm demo: (ε={epsilon:g}, δ={delta:g})-DP synthetic text",
        ))
    result, _ = synthesize_with_progress(
        loaded, tokenizer, model_name=model, data=data, per_class=per_class, config=config, dp=True,
        epsilon=epsilon, delta=delta, out=out, resume=True, labels=labels,
    )
    synth_wall_s = time.perf_counter() - start
    if not as_json:
        show_result(result, out, synth_wall_s)
    comparison = _compare(loaded, tokenizer, model, data, result.rows, eval_test, quiet=as_json, labels=labels)
    if as_json:
        print_json({
            "model": model_facts, "data": data_facts, "plan": list(PLAN), **summary(result, out, synth_wall_s),
            "comparison": comparison, "total_wall_s": time.perf_counter() - start,
        })


def _compare(
    model: object, tokenizer: object, model_name: str, data: str, rows: list[dict], eval_test: int, quiet: bool,
    labels: object = None,
) -> dict[str, dict[str, object]] | None:
    """Fine-tune on the synthetic rows and on a random real train subset with the same class counts;
    score both on the first ``eval_test`` examples of the test split. The real subset is a non-private
    reference: nothing from it reaches the synthetic output, which was written before this runs."""
    from privlm.evaluation.compare import synthetic_vs_random

    if eval_test == 0 or not rows:
        return None
    dataset = load_dataset(data, split="train", seed=SPLIT_SEED, labels=labels)
    test = load_dataset(data, split="test", seed=SPLIT_SEED, labels=labels).examples[:eval_test]
    config = preset("tiny" if model_name.startswith("tiny-") else "smollm2")
    synthetic = [(row["text"], int(row["label"])) for row in rows]
    with console.status(f"fine-tuning on {len(synthetic)} synthetic and {len(synthetic)} real examples, "
                        f"scoring {len(test)} test examples", spinner="dots") if not quiet else contextlib.nullcontext():
        scores = synthetic_vs_random(
            model, tokenizer, synthetic, dataset.examples, test, dataset.verbalizer.template,
            dataset.verbalizer.label_words, config, seed=0,
        )
    if not quiet:
        for name, label in (("synthetic", "DP synthetic (this run)"), ("random_real", "random real subset (non-private)")):
            s = scores[name]
            console.print(f"test accuracy after fine-tuning on {label}: {s['accuracy']:.3f} "
                          f"(95% CI {s['ci_low']:.3f}-{s['ci_high']:.3f}, n_test={s['n_test']})")
    return scores


def register(app: typer.Typer) -> None:
    """Add ``privlm demo``."""
    app.command("demo")(demo)
