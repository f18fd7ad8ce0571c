"""``privlm train``: private fine-tuning (DP-SGD, optionally with randomized clipping) end to end."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import typer

from privlm.cli._common import LABELS, TEST_FILE, console, err_console, print_json, public_classes
from privlm.cli._progress import cli_progress
from privlm.errors import UserError
from privlm.names import NORM_MODES, TASKS
from privlm.progress import SILENT, Progress
from privlm.training.recipe import defaults

CACHE_DTYPES = ("bfloat16", "float16", "float32")


def train_command(
    model: str = typer.Option("smollm2-135m", "--model", help="Registered name, local folder or hub id."),
    data: str | None = typer.Option(
        None,
        "--data",
        help="Dataset: bbc-news, rotten-tomatoes, jsonl:PATH, csv:PATH, ... (split 80/10/10, seeded); --task "
        "generate: bbc-headlines (BBC article → headline) or jsonl:/csv: rows with 'prompt' and 'completion'.",
    ),
    train: str | None = typer.Option(
        None,
        "--train",
        metavar="FILE",
        help="Private training file, .jsonl/.csv: the whole private set (replaces --data's train split).",
    ),
    test: str | None = TEST_FILE,
    task: str = typer.Option(
        "classify",
        "--task",
        help=f"One of {', '.join(TASKS)} (generate: learn each prompt's completion; scored by ROUGE of greedy "
        "completions).",
    ),
    labels: str | None = LABELS,
    template: str | None = typer.Option(
        None,
        "--template",
        metavar="TEXT",
        help="classify: the prompt of user data with {text} where the example goes (needs --labels; default "
        '"{text} Label:"). generate: how each prompt is phrased, {text} where it goes, \\n for a newline '
        '(default "{text}\\nHeadline: ").',
    ),
    max_new_tokens: int = typer.Option(
        32, "--max-new-tokens", help="generate: tokens decoded (greedy) per test prompt at evaluation."
    ),
    precision: str = typer.Option(
        "float32",
        "--precision",
        help="float32, or bf16: forward and backward under bf16 autocast; weights, per-sample norms, clipped "
        "sums and noise stay in float32 (the sensitivity the accountant assumes). bf16 needs book-keeping.",
    ),
    fsdp: bool = typer.Option(
        False,
        "--fsdp",
        help="Shard the model over the torchrun ranks with FSDP2 (each decoder block and the root); the update "
        "is the one-process update (docs/scaling-out.md). Excludes --head-only, --train-layers, --no-dp.",
    ),
    epsilon: float | None = typer.Option(None, "--epsilon", help="Privacy budget ε of the whole run."),
    noise_multiplier: float | None = typer.Option(
        None,
        "--noise-multiplier",
        help="σ instead of calibrating it to --epsilon (noise std σ·C); ε is accounted from it and reported. "
        "With --epsilon too, the run stops at the last step within that budget. 0 (without --epsilon): "
        "clipping without noise, NOT private, an ablation.",
    ),
    delta: float = typer.Option(1e-5, "--delta", help="Privacy parameter δ."),
    no_dp: bool = typer.Option(False, "--no-dp", help="No clipping, no noise: a NON-private baseline."),
    norm_mode: str = typer.Option("mixed", "--norm-mode", help=f"Per-sample norms: {', '.join(NORM_MODES)}."),
    probes: int = typer.Option(32, "--probes", help="Probes k (hutchinson) or m (hutchpp)."),
    bookkeeping: bool = typer.Option(
        True,
        "--bookkeeping/--second-backward",
        help="Clipped sum from stored activations (default; every released use of a weight is clipped) "
        "or by a second backward.",
    ),
    max_length: int | None = typer.Option(
        None, "--max-length", help="T: tokens per example (longer texts are cut). Default: 256 head-only, else 128."
    ),
    batch_size: int | None = typer.Option(
        None, "--batch-size", help="Expected logical batch size B (Poisson rate B/N). Default: 512 head-only, else 16."
    ),
    physical_batch_size: int | None = typer.Option(None, "--physical-batch-size", help="Micro-batch cap (memory)."),
    epochs: float | None = typer.Option(
        None, "--epochs", help="Passes over the data (in expectation). Default: 40 head-only, else 1."
    ),
    lr: float | None = typer.Option(None, "--lr", help="AdamW learning rate. Default: 1e-2 head-only, else 1e-3."),
    clip: float = typer.Option(1.0, "--clip", help="Per-sample clipping norm C."),
    lora: int | None = typer.Option(
        None, "--lora", help="LoRA rank R (0: full fine-tuning). Default: 0; classify without --lora trains head-only."
    ),
    head_only: bool | None = typer.Option(
        None,
        "--head-only/--no-head-only",
        help="classify: train only the label-word rows of the output layer (the default recipe for classify).",
    ),
    cache: bool = typer.Option(
        True,
        "--cache/--no-cache",
        help="Head-only and --train-layers: compute the frozen part once per example (private: kept with the run).",
    ),
    cache_dir: Path | None = typer.Option(
        None,
        "--cache-dir",
        help="Feature cache folder (default OUT/prefix-cache, deleted at the end); PRIVATE like the data.",
    ),
    cache_dtype: str = typer.Option(
        "bfloat16", "--cache-dtype", help=f"dtype of the cached features or hidden states: {', '.join(CACHE_DTYPES)}."
    ),
    lora_layers: int | None = typer.Option(
        None, "--lora-layers", help="LoRA only on the last N decoder blocks (default: all); backward stops there."
    ),
    train_layers: int | None = typer.Option(
        None,
        "--train-layers",
        help="Train only the last N decoder blocks (their LoRA adapters with --lora R, else their weights) over "
        "the frozen lower layers' hidden states, cached once per example (--no-cache: recomputed every step).",
    ),
    out: Path = typer.Option(..., "--out", help="Run folder: model/adapter, privacy.json, metrics.jsonl, checkpoints."),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue from the last checkpoint in --out (same settings, training data and model: checked).",
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="Reproducible sampling and noise; keep it secret (it reveals the noise)."
    ),
    loss_bound: float = typer.Option(
        10.0, "--loss-bound", help="L: per-sample (mean token) losses are clamped to [0, L] for the DP loss."
    ),
    loss_noise_fraction: float = typer.Option(
        0.2,
        "--loss-noise-fraction",
        help="α: the DP loss shares the gradient's noise; ε is accounted at σ/sqrt(1+α²). 0: no loss is shown or logged.",
    ),
    checkpoint_every: int = typer.Option(50, "--checkpoint-every", help="Checkpoint every N steps."),
    max_train: int | None = typer.Option(None, "--max-train", help="Train on the first N examples of the train split."),
    max_test: int | None = typer.Option(None, "--max-test", help="Score only the first N test examples."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Fine-tune MODEL on the train split of DATA (or the --train file) with DP-SGD at (ε, δ); score the test split."""
    from privlm.resources.completions import completion_spec
    from privlm.resources.datasets import data_spec
    from privlm.training.loop import TrainConfig, check_run_dir
    from privlm.training.run import fine_tune, set_up

    if cache_dtype not in CACHE_DTYPES:
        raise UserError(f"--cache-dtype must be one of {', '.join(CACHE_DTYPES)}, got {cache_dtype!r}")
    if task == "generate" and labels is not None:
        raise UserError(
            "--labels names the classes of a classify task; --task generate learns the completion of each prompt "
            "(rows with 'prompt' and 'completion') and has no classes: drop --labels"
        )
    if no_dp and (epsilon is not None or noise_multiplier is not None):
        raise UserError("--no-dp cannot be combined with --epsilon or --noise-multiplier")
    if not no_dp and epsilon is None and noise_multiplier is None:
        raise UserError(
            "give --epsilon (the privacy budget) or --noise-multiplier, or --no-dp for a non-private baseline"
        )
    if max_test is not None and max_test < 1:
        raise UserError(f"--max-test must be >= 1, got {max_test}")
    chosen = defaults(
        task,
        {
            "head_only": head_only,
            "lora": lora,
            "lora_layers": lora_layers,
            "train_layers": train_layers,
            "batch_size": batch_size,
            "epochs": epochs,
            "lr": lr,
            "max_length": max_length,
        },
    )
    head_only, lora, batch_size, epochs, lr, max_length = (
        chosen[k] for k in ("head_only", "lora", "batch_size", "epochs", "lr", "max_length")
    )
    config = TrainConfig(
        task=task,
        epsilon=epsilon,
        noise_multiplier=noise_multiplier,
        delta=delta,
        private=not no_dp,
        norm_mode=norm_mode,
        probes=probes,
        bookkeeping=bookkeeping,
        max_length=max_length,
        batch_size=batch_size,
        epochs=epochs,
        lr=lr,
        max_grad_norm=clip,
        physical_batch_size=physical_batch_size,
        lora=lora,
        lora_layers=lora_layers,
        train_layers=train_layers,
        head_only=head_only,
        cache=cache_dtype if cache else None,
        seed=seed,
        checkpoint_every=checkpoint_every,
        loss_bound=loss_bound,
        loss_noise_fraction=loss_noise_fraction,
        template=None if task != "generate" or template is None else template.replace("\\n", "\n"),
        max_new_tokens=max_new_tokens,
        precision=precision,
        fsdp=fsdp,
    )
    if task == "generate":
        spec, classes = completion_spec(data, train, None, test), None
    else:
        spec, classes = data_spec(data, train, None, test), public_classes(labels, template)
    check_run_dir(out, config, resume, int(os.environ.get("WORLD_SIZE", "1")))
    start = time.perf_counter()
    label = "DP loss" if config.differentially_private else "loss (not private)"
    with _progress() as progress:
        session = set_up(
            model,
            spec,
            config,
            max_train,
            classes,  # class names of user data: public input
            cache_dir or out / "prefix-cache",
            progress=progress,
        )
        bar = progress.task("training")

        def on_progress(step: int, total: int, loss: float | None, eps: float | None) -> None:
            # the last logged loss (shown once the ledger covers it); "-" before the first log line
            unset = "off" if config.private and config.loss_release() is None else "-"
            shown = unset if loss is None else f"{loss:.4f}"
            privacy = "n/a (not private)" if eps is None else f"{eps:.3f}"
            bar.update(completed=step, total=total, description=f"training ({label} {shown}, ε {privacy})")
            if step == total:
                bar.done()

        summary = fine_tune(session, out, resume=resume, max_test=max_test, on_progress=on_progress, progress=progress)
        bar.done()
    if not session.run.ctx.is_main:
        return  # under torchrun, rank 0 reports
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    if as_json:
        print_json(summary)
        return
    test = summary.get("test", {})
    if "accuracy" in test:
        metric = (
            f"test accuracy {test['accuracy']:.1%} (95% CI {test['ci_low']:.1%}–{test['ci_high']:.1%}, "
            f"n={test['n_test']})"
        )
    elif "rouge1" in test:
        metric = (
            f"test ROUGE-1/2/L {test['rouge1']:.3f}/{test['rouge2']:.3f}/{test['rougeL']:.3f}, exact match "
            f"{test['exact_match']:.1%} (n={test['n']}); "
            + (
                f"{summary['rows_cut']} training prompts cut to fit"
                if summary.get("rows_cut") is not None
                else "training prompts beyond --max-length cut (their count is not released for private data)"
            )
        )
    else:
        metric = f"test perplexity {test.get('perplexity', float('nan')):.2f}"
    privacy = (
        "NOT private (--no-dp)"
        if not config.private
        else "NOT private: clipping without noise (--noise-multiplier 0, an ablation)"
        if config.clip_only
        else f"(ε = {summary['epsilon']:.3f}, δ = {delta:g})-DP, σ = {summary['noise_multiplier']:.4f}"
        + (
            ""
            if config.loss_release() is None
            else f" (accounted {summary['accounted_noise_multiplier']:.4f}: gradient + DP loss)"
        )
    )
    if config.differentially_private and not summary["private_release"]:
        privacy += " — NOT a private release: --seed makes the noise reproducible"
    console.print(
        f"{summary['steps']}/{summary['planned_steps']} steps ({summary['stopped']}); {privacy}; {metric}; "
        f"{summary.get('saved', out)} [{summary['wall_s']:.0f} s]"
    )


@contextlib.contextmanager
def _progress() -> Iterator[Progress]:
    """Progress bars (or log lines) on stderr on the main process; nothing on the other ranks of torchrun."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield SILENT
        return
    with cli_progress(err_console) as progress:
        yield progress


def register(app: typer.Typer) -> None:
    """Add ``privlm train``."""
    app.command("train")(train_command)
