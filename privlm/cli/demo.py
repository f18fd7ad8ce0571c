"""``privlm demo``: DP synthetic text (GRADMM, ε = 4, δ = 1e-5) from rotten-tomatoes with SmolLM2-135M.

Runs the ``instruct`` preset (GRADMM generate-select over the public model's answers to each class's
instruction, contrastive objective) and prints the synthetic examples beside the privacy they cost, then
fine-tunes the model on the synthetic set and on a random real subset of the same size (a non-private
reference) and prints both test accuracies. Output goes to the privlm cache
(``demo/<model>--<data>--instruct/synthetic.jsonl``) unless ``--out``
is given; a second run reuses the saved DP release and finished batches (``--resume`` semantics), so it
spends no further privacy budget and prints the same examples.

``--methods gradmm,pe,dp-finetune`` runs several DP methods (each through the code ``privlm synth --method``
runs), each writing its own set next to the output (``synthetic.jsonl`` for gradmm, ``synthetic-pe.jsonl``,
...). ``--epsilon``/``--delta`` are the budget of the DP sets together (not of the non-private reference
accuracies, the test scores or the wall times, which the run names as not DP): with k methods each gets
(ε/k, δ/k), so all k sets together are (ε, δ)-DP by basic composition (each method calibrates its noise so
that its own accountant reports at most its share; the printed total sums the sidecars). The closing comparison fine-tunes on each set and once on a random real
subset and names the DP method whose set scored best (ties: the first given).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.panel import Panel
from rich.table import Table

from privlm.cli._common import LABELS_HELP, console, err_console, print_json
from privlm.cli._progress import cli_progress
from privlm.cli.models import load_with_status
from privlm.cli.synth import check_privacy_args, show_outcome
from privlm.errors import UserError
from privlm.lm.finetune_config import preset
from privlm.names import DEFAULT_MODEL
from privlm.resources.cache import cache_root
from privlm.resources.datasets import BUILTIN, DEFAULT_DATASET, load_dataset
from privlm.synthesis.command import SPLIT_SEED, SynthRequest
from privlm.synthesis.registry import synth_commands

DEMO_EPSILON = 4.0
DEMO_DELTA = 1e-5
DEFAULT_METHODS = "gradmm"
DEMO_PRESET = "instruct"  # GRADMM generate-select on instructed candidates (privlm.synthesis.gradmm.config.PRESETS)
# Each method's options in the demo beyond its privlm synth defaults (GRADMM: the instruct preset).
DEMO_OPTIONS: dict[str, dict[str, Any]] = {"gradmm": {"preset": DEMO_PRESET}}
COMPARE_ONE = "fine-tune on the synthetic set and on a random real subset of the same size; print both test accuracies"
COMPARE_MANY = (
    "fine-tune on each DP synthetic set and once on a random real subset; print the test accuracies "
    "and the DP method whose set scored best"
)
NOT_DP = (
    "the random real subset's accuracy (a non-private reference: it trains on the private data directly)",
    "every accuracy's test split (scored directly; the guarantee covers the train split)",
    "wall times (they follow the private set's size)",
)
SYNTH_METHODS = tuple(synth_commands())


def default_out(model: str, data: str) -> Path:
    """``<cache>/demo/<model>--<data>--<preset>/synthetic.jsonl`` (names made file-system safe)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{model}--{data}--{DEMO_PRESET}")
    return cache_root() / "demo" / slug / "synthetic.jsonl"


def parse_methods(text: str) -> list[str]:
    """``--methods``: a comma list of ``privlm synth --method`` names, each once, in the order given."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SYNTH_METHODS]
    if not names or unknown:
        raise UserError(
            f"--methods {text!r}: give a comma list of {', '.join(SYNTH_METHODS)}"
            + (f" ({', '.join(map(repr, unknown))} is not one)" if unknown else "")
        )
    if len(set(names)) < len(names):
        raise UserError(f"--methods {text!r} names a method twice")
    return names


def method_out(out: Path, method: str) -> Path:
    """Where ``method``'s set goes: ``out`` itself for gradmm (as before ``--methods``), else ``<stem>-<method>.jsonl``."""
    return out if method == "gradmm" else out.with_name(f"{out.stem}-{method}{out.suffix}")


def plan(methods: Sequence[str]) -> list[str]:
    """The steps shown before the run: each method's plan (its :class:`SynthCommand`), then the comparison."""
    commands = synth_commands()
    if len(methods) == 1:
        return [*commands[methods[0]].plan, COMPARE_ONE]
    return [f"{method}: {step}" for method in methods for step in commands[method].plan] + [COMPARE_MANY]


def demo(
    model: str = typer.Option(DEFAULT_MODEL, help="Model name, local folder or hub id."),
    data: str = typer.Option(DEFAULT_DATASET, help="Private dataset: name, jsonl:PATH or csv:PATH."),
    labels: str | None = typer.Option(None, "--labels", metavar="NAMES", help=LABELS_HELP),
    per_class: int = typer.Option(10, "--per-class", help="Synthetic examples per class."),
    epsilon: float = typer.Option(
        DEMO_EPSILON,
        "--epsilon",
        help="Privacy budget of all DP synthetic sets together (the reference accuracies are not DP).",
    ),
    delta: float = typer.Option(DEMO_DELTA, "--delta", help="δ of all DP synthetic sets together."),
    methods: str = typer.Option(
        DEFAULT_METHODS,
        "--methods",
        metavar="LIST",
        help=f"comma list of DP methods ({', '.join(SYNTH_METHODS)}); with k methods each gets (ε/k, δ/k) "
        "(basic composition), so all sets together stay within --epsilon/--delta",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Output JSONL (default: in the privlm cache); other methods' sets go beside it."
    ),
    eval_test: int = typer.Option(
        200, "--eval-test", help="Test examples for the closing accuracy comparison (0 skips it)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Make DP synthetic text from the private train split with one or more DP methods (default GRADMM), then
    compare fine-tuning on each set with a random real subset; with k methods each gets (ε/k, δ/k)."""
    check_privacy_args(epsilon, delta, no_dp=False)
    if eval_test < 0:
        raise UserError(f"--eval-test must be >= 0 (got {eval_test})")
    names = parse_methods(methods)
    start = time.perf_counter()
    commands = synth_commands()
    share_epsilon, share_delta = epsilon / len(names), delta / len(names)  # basic composition over the k sets
    out = out if out is not None else default_out(model, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in SYNTH_METHODS:  # every method's folder beside the output, named in this run or not
        check_saved_budget(name, method_out(out, name), share_epsilon, share_delta, names)
    runners = {  # each checked before the model is loaded or anything is drawn
        name: commands[name].start(
            SynthRequest(
                name,
                model,
                data,
                labels,
                per_class,
                method_out(out, name),
                True,
                share_epsilon,
                share_delta,
                resume=True,
                options=DEMO_OPTIONS.get(name, {}),
            )
        )
        for name in names
    }
    loaded, tokenizer, model_facts = load_with_status(model)
    dataset = load_dataset(data, labels=labels)
    data_facts = {
        "name": data,
        **public_sizes(data, dataset),
        "verbalizer": dataset.verbalizer.to_dict(),
    }
    steps = plan(names)
    if not as_json:
        split = (
            ""
            if len(names) == 1
            else (
                f"\nbudget split by basic composition over {len(names)} methods: "
                f"each (ε={share_epsilon:.4g}, δ={share_delta:.3g})"
            )
        )
        console.print(
            Panel.fit(
                f"model [bold]{model}[/]: {model_facts['architecture']}, {model_facts['parameters']:,} parameters\n"
                f"private data [bold]{data}[/] (train split, all per class)\n"
                + "\n".join(f"{i}. {line}" for i, line in enumerate(steps, start=1))
                + split,
                title=f"privlm demo: (ε={epsilon:g}, δ={delta:g})-DP synthetic text",
            )
        )
    runs: list[dict[str, Any]] = []
    for name in names:
        with cli_progress(err_console) as progress:
            outcome = runners[name](loaded, tokenizer, progress)
        if not as_json:
            show_outcome(outcome)
        runs.append({**outcome.summary(), "method": name, "budget": {"epsilon": share_epsilon, "delta": share_delta}})
    total = {"epsilon": sum(r["privacy"]["epsilon"] for r in runs), "delta": sum(r["privacy"]["delta"] for r in runs)}
    if total["epsilon"] > epsilon * (1 + 1e-9) or total["delta"] > delta * (1 + 1e-9):
        err_console.print(
            f"[bold red]warning[/]: the sets together account (ε = {total['epsilon']:.6g}, "
            f"δ = {total['delta']:.3g}), above the budget (ε = {epsilon:g}, δ = {delta:g}) "
            "(a counted redraw after a crash?)"
        )
    if not as_json and len(names) > 1:
        console.print(
            f"all {len(names)} sets together: (ε = {total['epsilon']:.4g}, δ = {total['delta']:.3g})-DP "
            f"by basic composition (sum of the sidecars; budget ε = {epsilon:g}, δ = {delta:g})"
        )
    # the random real reference reads the private data directly: only now, after every DP set is written
    comparison = _compare(
        loaded, tokenizer, model, data, {r["method"]: r["rows"] for r in runs}, eval_test, quiet=as_json, labels=labels
    )
    for run in runs:
        run["scores"] = None if comparison is None else comparison.get(run["method"])
    best = best_method(runs) if len(runs) > 1 else None
    if not as_json:
        show_comparison(runs, comparison, best, eval_test)
        console.print("not covered by the (ε, δ) statement: " + "; ".join(NOT_DP))
    if as_json:
        first = runs[0]
        print_json(
            {
                "model": model_facts,
                "data": data_facts,
                "plan": steps,
                **{k: v for k, v in first.items() if k not in ("method", "budget", "scores")},
                "comparison": None
                if comparison is None or first["scores"] is None
                else {"synthetic": first["scores"], "random_real": comparison["random_real"]},
                "methods": runs,
                "best_method": best,
                "privacy_total": total,
                "total_wall_s": time.perf_counter() - start,
                "not_differentially_private": list(NOT_DP),
            }
        )


def public_sizes(data: str, dataset: Any) -> dict[str, Any]:
    """The corpus and split sizes of a built-in data set (public: documented with the data set); nothing
    for user data, whose size is private (an exact N reveals membership under add/remove adjacency)."""
    if data in BUILTIN:
        return {
            "num_examples": len(dataset),
            "split_sizes": dataset.split_sizes,
            "sizes_note": "public: the documented sizes of a built-in data set",
        }
    return {"sizes_note": "not printed: the size of a private data set is not released"}


def check_saved_budget(method: str, out: Path, epsilon: float, delta: float, names: Sequence[str]) -> None:
    """Refuse, before any method runs, a saved ``method`` run beside the output that this run could not count
    within its budget: one at another (ε, δ) than this run's share (it cannot be reused: each method would
    refuse it on resume, maybe after another has spent its share), or one of a method not in ``names`` (the
    folder's sets together would then cost more than the ε this run reports)."""
    manifest = synth_commands()[method].folder(out).manifest
    if not manifest.is_file():
        return
    saved = json.loads(manifest.read_text())
    made_at = f"(ε={saved.get('epsilon')}, δ={saved.get('delta')})"
    if method not in names:
        raise UserError(
            f"{manifest.parent} holds a {method} set made at {made_at} from an earlier demo; this run "
            f"({', '.join(names)}) would add to it beyond its budget: give another --out, or name {method} too"
        )
    if (saved.get("epsilon"), saved.get("delta")) != (epsilon, delta):
        raise UserError(
            f"{manifest.parent} holds a {method} set made at {made_at}; this run gives each of its "
            f"{len(names)} method(s) (ε={epsilon:g}, δ={delta:g}), so it cannot reuse it: "
            "give another --out (removing that folder does not refund the privacy it spent)"
        )


def best_method(runs: Sequence[dict[str, Any]]) -> str | None:
    """The method whose set scored the highest test accuracy (ties: the first in ``runs``); None if none was scored."""
    best: dict[str, Any] | None = None
    for run in runs:
        if run["scores"] is not None and (best is None or run["scores"]["accuracy"] > best["scores"]["accuracy"]):
            best = run
    return None if best is None else best["method"]


def show_comparison(
    runs: Sequence[dict[str, Any]],
    comparison: dict[str, dict[str, Any]] | None,
    best: str | None,
    eval_test: int,
) -> None:
    """The closing table (method, its ε, test accuracy with 95% CI) and, for several methods, the best one."""
    if comparison is None:
        why = "--eval-test 0" if eval_test == 0 else "no synthetic examples were kept"
        console.print(f"no accuracy comparison was run ({why}); no best method is named")
        return
    table = Table(title=f"test accuracy after fine-tuning (n_test = {comparison['random_real']['n_test']})")
    for col in ("training set", "ε", "examples", "accuracy (95% CI)"):
        table.add_column(col)

    def cells(s: dict[str, Any]) -> list[str]:
        return [str(s["n_train"]), f"{s['accuracy']:.3f} ({s['ci_low']:.3f}-{s['ci_high']:.3f})"]

    for run in runs:
        s = run["scores"]
        table.add_row(
            f"DP synthetic: {run['method']}",
            f"{run['privacy']['epsilon']:.4g}",
            *(cells(s) if s is not None else ["0", "– (no examples)"]),
        )
    table.add_row("random real subset (non-private)", "∞", *cells(comparison["random_real"]))
    console.print(table)
    if best is not None:
        console.print(f"best DP synthetic set: {best} (accuracy {comparison[best]['accuracy']:.3f})")


def _compare(
    model: object,
    tokenizer: object,
    model_name: str,
    data: str,
    sets: dict[str, list[dict]],
    eval_test: int,
    quiet: bool,
    labels: object = None,
) -> dict[str, dict[str, object]] | None:
    """Fine-tune on each method's synthetic rows (``sets``; empty ones skipped) and once on a random real train
    subset with the largest class counts of any set; score all on the first ``eval_test`` examples of the test
    split. The real subset is a non-private reference: nothing from it reaches the synthetic outputs, which
    were all written before this runs."""
    from privlm.evaluation.compare import sets_vs_random

    synthetic = {name: [(row["text"], int(row["label"])) for row in rows] for name, rows in sets.items() if rows}
    if eval_test == 0 or not synthetic:
        return None
    dataset = load_dataset(data, split="train", seed=SPLIT_SEED, labels=labels)
    test = load_dataset(data, split="test", seed=SPLIT_SEED, labels=labels).examples[:eval_test]
    config = preset("tiny" if model_name.startswith("tiny-") else "smollm2")
    sizes = " and ".join(f"{len(rows)}" for rows in synthetic.values())
    with (
        console.status(
            f"fine-tuning on {sizes} synthetic examples and on a random real subset, scoring {len(test)} test examples",
            spinner="dots",
        )
        if not quiet
        else contextlib.nullcontext()
    ):
        return sets_vs_random(
            model,
            tokenizer,
            synthetic,
            dataset.examples,
            test,
            dataset.verbalizer.template,
            dataset.verbalizer.label_words,
            config,
            seed=0,
        )


def register(app: typer.Typer) -> None:
    """Add ``privlm demo``."""
    app.command("demo")(demo)
