"""``privlm eval``: fine-tune a model on a training file and report accuracy on every row of a test set (or, with
``--task generate``, ROUGE-1/2/L F1 and exact match of its greedy completions of the test prompts)."""

from __future__ import annotations

import math
import time
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from privlm.cli._common import (
    LABELS,
    TEMPLATE,
    TEST_FILE,
    VALIDATION_FILE,
    console,
    err_console,
    print_json,
    public_classes,
)
from privlm.cli._progress import cli_progress
from privlm.lm.finetune_config import PRESETS, FinetuneConfig, preset
from privlm.names import DEFAULT_MODEL


def eval_command(
    train: str | None = typer.Option(
        None,
        "--train",
        metavar="FILE",
        help="Training set, whole: JSONL/CSV rows with text and label (a class name or index), e.g. privlm synth's "
        "output; default: the train split of --data.",
    ),
    test: str | None = TEST_FILE,
    validation: str | None = VALIDATION_FILE,
    data: str | None = typer.Option(
        None,
        "--data",
        help="Dataset whose seeded splits give those not given as files (e.g. rotten-tomatoes, jsonl:PATH).",
    ),
    model_name: str = typer.Option(DEFAULT_MODEL, "--model", help="Model name or local folder."),
    preset_name: str = typer.Option("smollm2", "--preset", help=f"Fine-tuning preset: {', '.join(PRESETS)}."),
    epochs: int | None = typer.Option(None, min=1, help="Override the preset's epochs."),
    lr: float | None = typer.Option(None, help="Override the preset's learning rate."),
    lora_rank: int | None = typer.Option(None, min=0, help="Override the preset's LoRA rank (0: full fine-tuning)."),
    select_epoch: bool = typer.Option(False, "--select-epoch", help="Keep the best epoch on the validation split."),
    max_test: int | None = typer.Option(None, min=1, help="Score a seeded subset of this many test examples."),
    max_validation: int = typer.Option(200, min=1, help="Validation examples used by --select-epoch."),
    seed: int = typer.Option(0, help="Seed of the split, the subsets and fine-tuning."),
    labels: str | None = LABELS,
    template: str | None = TEMPLATE,
    task: str = typer.Option(
        "classify",
        "--task",
        help="classify, or generate: rows with 'prompt' and 'completion' (e.g. bbc-headlines), fine-tuned on the "
        "completions and scored by ROUGE-1/2/L F1 and exact match of greedy completions (--template phrases the "
        'prompt, \\n for a newline; default "{text}\\nHeadline: ").',
    ),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", min=1, help="generate: tokens decoded per prompt."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Fine-tune MODEL on the training set (label-word loss) and score it on every row of the test set."""
    from privlm.errors import UserError
    from privlm.evaluation.evaluate import fit_and_score
    from privlm.experiments.sampling import subsample
    from privlm.lm.prompts import check_label_words
    from privlm.resources.datasets import data_spec, load_dataset
    from privlm.resources.models import load_model

    overrides = {k: v for k, v in {"epochs": epochs, "lr": lr, "lora_rank": lora_rank}.items() if v is not None}
    config = preset(preset_name, seed=seed, **overrides)
    if task == "generate":
        if labels is not None or select_epoch:
            raise UserError("--task generate has no classes: drop --labels and --select-epoch")
        _eval_generate(model_name, config, data, train, validation, test, template, max_new_tokens, max_test, as_json)
        return
    if task != "classify":
        raise UserError(f"--task must be classify or generate, got {task!r}")
    spec, classes = data_spec(data, train, validation, test), public_classes(labels, template)
    test_set = load_dataset(spec, split="test", seed=seed, labels=classes)
    train_examples = load_dataset(spec, split="train", seed=seed, labels=classes).examples
    test_examples = subsample(test_set.examples, max_test, seed)
    validation_examples = None
    if select_epoch:
        validation_examples = subsample(
            load_dataset(spec, split="validation", seed=seed, labels=classes).examples, max_validation, seed
        )
    start = time.perf_counter()
    model, tokenizer = load_model(model_name, seed=seed)
    check_label_words(tokenizer, test_set.verbalizer)
    steps = config.epochs * math.ceil(len(train_examples) / config.batch_size)
    with Progress(
        TextColumn("fine-tuning"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=as_json,
    ) as progress:
        task = progress.add_task("fine-tuning", total=steps, loss="-")
        row = fit_and_score(
            model,
            tokenizer,
            train_examples,
            test_examples,
            test_set.verbalizer.template,
            test_set.verbalizer.label_words,
            config,
            validation=validation_examples,
            on_step=lambda step, loss: progress.update(task, completed=step, loss=f"{loss:.3f}"),
        )
    _report(
        row,
        model_name,
        spec,
        config,
        start,
        as_json,
        f"test accuracy {row['accuracy']:.1%} (95% CI {row['ci_low']:.1%}–{row['ci_high']:.1%}, "
        f"n={row['n_test']}) after fine-tuning {model_name} on {row['n_train']} examples ({spec})",
    )


def _eval_generate(
    model_name: str,
    config: FinetuneConfig,
    data: str | None,
    train: str | None,
    validation: str | None,
    test: str | None,
    template: str | None,
    max_new_tokens: int,
    max_test: int | None,
    as_json: bool,
) -> None:
    """Fine-tune (not privately) on the training completions with the preset's epochs, lr, batch, LoRA rank
    and T, then score the greedy completions of the test prompts (a seeded subset of ``max_test``)."""
    from dataclasses import replace

    from privlm.experiments.sampling import subsample
    from privlm.resources.completions import completion_spec
    from privlm.resources.models import load_model
    from privlm.training.data import encode, load_task_data, make_collate
    from privlm.training.evaluate import generation_report
    from privlm.training.loop import TrainConfig, prepare, train_loop
    from privlm.training.run import with_lora

    spec = completion_spec(data, train, validation, test)
    prompt = None if template is None else template.replace("\\n", "\n")
    task_data = load_task_data(spec, "generate", config.seed, None, prompt)
    task_data = replace(task_data, test=tuple(subsample(task_data.test, max_test, config.seed)))
    settings = TrainConfig(
        task="generate",
        private=False,
        lora=config.lora_rank,
        batch_size=config.batch_size,
        epochs=config.epochs,
        lr=config.lr,
        max_length=config.max_length,
        seed=config.seed,
        template=task_data.template,
        max_new_tokens=max_new_tokens,
    )
    start = time.perf_counter()
    model, tokenizer = load_model(model_name, seed=config.seed)
    module = with_lora(model, config.lora_rank, config.seed)
    module.train()
    run = prepare(module, encode(task_data, tokenizer, config.max_length), make_collate(tokenizer), settings)
    with cli_progress(err_console) as progress:
        steps = progress.task("fine-tuning")
        train_loop(run, on_progress=lambda step, total, *_: steps.update(completed=step, total=total))
        steps.done()
        decoding = progress.task("decoding the test prompts (greedy)", total=len(task_data.test))
        metrics, _ = generation_report(
            module, tokenizer, task_data, config.max_length, max_new_tokens, on_batch=decoding.advance
        )
        decoding.done()
    _report(
        {**metrics, "n_train": len(task_data.train)},
        model_name,
        spec,
        config,
        start,
        as_json,
        f"test ROUGE-1/2/L {metrics['rouge1']:.3f}/{metrics['rouge2']:.3f}/{metrics['rougeL']:.3f}, exact match "
        f"{metrics['exact_match']:.1%} (n={metrics['n']}) after fine-tuning {model_name} on "
        f"{len(task_data.train)} completions ({spec})",
    )


def _report(
    metrics: dict[str, Any], model_name: str, spec: object, config: Any, start: float, as_json: bool, line: str
) -> None:
    """The summary of one ``privlm eval`` (its test metrics, model, data, recipe, wall time): JSON or ``line``."""
    summary = {
        **metrics,
        "model": model_name,
        "data": str(spec),
        "finetune": config.__dict__,
        "wall_time_s": round(time.perf_counter() - start, 2),
    }
    if as_json:
        print_json(summary)
        return
    console.print(f"{line} [{summary['wall_time_s']:.0f} s]")


def register(app: typer.Typer) -> None:
    """Add ``privlm eval``."""
    app.command("eval")(eval_command)
