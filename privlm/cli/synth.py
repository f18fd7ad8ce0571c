"""``privlm synth``: differentially private synthetic text with GRADMM (default), Private Evolution (``--method pe``)
or DP fine-tune-then-generate (``--method dp-finetune``)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from privlm.cli._common import LABELS, TEMPLATE, console, err_console, print_json, public_classes
from privlm.errors import UserError
from privlm.gradmm.config import OPTIMIZERS, PRESETS, RELEASES, SOURCES, SynthConfig, make_config
from privlm.resources.datasets import DataSpec
from privlm.synthesis.registry import synth_methods

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from privlm.gradmm.pipeline import SynthResult
    from privlm.runfolder import RunFolder

SPLIT_SEED = 0  # the private set is the train split of the dataset's standard seeded split
SYNTH_METHODS = tuple(sorted(synth_methods()))  # the registry's methods that privlm synth runs


def private_examples(data: str | DataSpec, per_class: int | None, labels: object = None) -> Callable[[], list[tuple[str, int]]]:
    """A loader of the private examples: the train split, the first ``per_class`` of each class.

    Unit of privacy: this list *is* the private dataset of the guarantee (add/remove one of its
    examples, sensitivity C). The selection is by position, so if a larger file is regarded as the
    private dataset, adding one record there can also push another out of the first ``per_class``
    (sensitivity up to 2C), which the stated ε does not cover: ε is for the set read, as the README says.
    The train split of user data is per row (a row's split depends on its own text only), so it adds
    no such effect; the built-in data sets' stratified split does. A file given as ``--train`` is the
    whole private set. ``labels``: the public class names (``--labels``), never read off the rows."""

    def load() -> list[tuple[str, int]]:
        from privlm.resources.datasets import load_dataset

        taken: dict[int, int] = {}
        chosen = []
        for text, label in load_dataset(data, split="train", seed=SPLIT_SEED, labels=labels).examples:
            if per_class is None or taken.get(label, 0) < per_class:
                taken[label] = taken.get(label, 0) + 1
                chosen.append((text, label))
        if per_class is not None and min(taken.values(), default=0) < per_class:
            raise UserError(
                f"--private-per-class {per_class} is larger than a class of the private train split (class sizes "
                "are private and not shown); omit it to use the whole split"
            )
        return chosen

    return load


def synthesize_with_progress(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    model_name: str,
    data: str | DataSpec,
    per_class: int,
    config: SynthConfig,
    dp: bool,
    epsilon: float | None,
    delta: float | None,
    out: Path,
    resume: bool,
    labels: object = None,
) -> tuple[SynthResult, float]:
    """Read the dataset's public verbalizer, run the pipeline with rich progress bars.

    Returns the result and the wall time in seconds (model loading excluded). ``labels``: the public
    class names (and words, template) of user data, ``--labels`` and ``--template``.
    """
    from privlm.gradmm.generate import batches_per_class
    from privlm.gradmm.pipeline import RunPaths, run_synthesis
    from privlm.gradmm.prompt import build_prompt
    from privlm.resources.datasets import load_dataset

    start = time.perf_counter()
    if per_class < 1:
        raise UserError(f"--per-class must be >= 1 (got {per_class})")
    if not out.parent.is_dir():
        raise UserError(f"output folder {out.parent} does not exist")
    dataset = load_dataset(data, split=None, seed=SPLIT_SEED, labels=labels)  # only its public verbalizer is used
    # --source instruct without --instruction: the verbalizer's instructions, as zero-shot's (None: its default)
    config = replace(config, instructions=dataset.verbalizer.instructions(dataset.label_names))
    model.requires_grad_(False)
    prompt = build_prompt(
        tokenizer, dataset.verbalizer.template, dataset.verbalizer.label_words, dataset.label_names
    )
    load_private = private_examples(data, config.private_per_class, labels)
    if not RunPaths(out).release.exists():
        examples = load_private()  # a cut larger than a class, or bad rows, are refused here, before anything is written
        load_private = examples.copy
    n_batches = batches_per_class(per_class, config) * len(prompt.label_token_ids)
    columns = (TextColumn("{task.description}"), BarColumn(), _PublicCount(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=False) as progress:
        private = progress.add_task("DP release (reading the private examples)", total=None, private=True)
        batches = progress.add_task("ADMM batches", total=n_batches)
        steps = progress.add_task("ADMM steps", total=config.outer_steps * config.inner_steps)

        def on_step(outer: int, inner: int, loss: float) -> None:
            done = outer * config.inner_steps + inner + 1
            progress.update(steps, completed=done, description=f"ADMM steps (match loss {loss:.4f})")

        def on_batch(label: int, index: int) -> None:
            progress.update(private, total=1, completed=1)  # the private pass is over once synthesis starts
            progress.advance(batches)
            progress.reset(steps, description="ADMM steps")

        result = run_synthesis(
            model, tokenizer, prompt, load_private,
            out=out, per_class=per_class, config=config, dp=dp, epsilon=epsilon, delta=delta, resume=resume,
            settings={"model": model_name, "data": str(data)},
            on_private_batch=lambda n: progress.refresh(),  # never counted: the count would be the set's size N
            on_step=on_step, on_batch=on_batch,
        )
    return result, time.perf_counter() - start


class _PublicCount(MofNCompleteColumn):
    """M/N for a task, blank for the private pass: its count would show the private set's size N, which GRADMM
    never releases (:func:`privlm.gradmm.pipeline.private_set`)."""

    def render(self, task: Task) -> Text:
        return Text("") if task.fields.get("private") else super().render(task)


def print_rows(title: str, rows: list[dict[str, Any]], score: str, show: Callable[[dict[str, Any]], str]) -> None:
    """The synthetic rows as a rich table: label name, ``score`` (``show(row)``) and text."""
    table = Table(title=title)
    for col in ("label", score, "text"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["label_name"], show(row), row["text"])
    console.print(table)


def show_result(result: SynthResult, out: Path, wall_s: float) -> None:
    """The examples beside the privacy they cost, as a rich table."""
    from privlm.gradmm.pipeline import RunPaths

    print_rows(f"synthetic examples ({out})", result.rows, "match loss", lambda row: f"{row['match_loss']:.4f}")
    privacy = result.privacy
    if privacy["dp"]:
        console.print(
            f"privacy spent: (ε = {privacy['epsilon']:.4g}, δ = {privacy['delta']:.3g})-DP for the whole output "
            f"(σ = {privacy['noise_multiplier']:.4f}, C = {privacy['clip']:g}); release {privacy['release_sha256'][:16]}"
            + (" (reused, no new privacy spent)" if result.reused_release else "")
        )
        if "private_data" in privacy:
            console.print(f"private set: {privacy['private_data']} (its size is not released)")
        rows = privacy["released_rows"]
        console.print(
            f"[yellow]signal vs noise: the release keeps {'all' if rows == 'all' else len(rows)} rows of the LM-head "
            f"gradient ({privacy['released_dim_per_class']:,} coordinates per class); each class target carries noise "
            f"of norm ≈ {privacy['noise_norm_per_class']:,.0f}, and n private examples add at most "
            f"n·C = n·{privacy['clip']:g}: with fewer than ≈ {privacy['examples_per_class_to_match_noise']:,.0f} "
            "examples per class the target is mostly noise and the text depends on it little.[/yellow]"
        )
    else:
        console.print(f"[bold red]{privacy['warning']}[/bold red]")
    console.print(f"{len(result.rows)} examples in {out} (sidecar {RunPaths(out).sidecar}), {wall_s:.0f} s")


def summary(result: SynthResult, out: Path, wall_s: float) -> dict[str, Any]:
    """The ``--json`` output."""
    return {"out": str(out), "rows": result.rows, "privacy": result.privacy,
            "reused_release": result.reused_release, "wall_s": wall_s}


def check_privacy_args(epsilon: float | None, delta: float | None, no_dp: bool) -> None:
    """Exactly one of ``--epsilon E --delta D`` and ``--no-dp``."""
    if no_dp and (epsilon is not None or delta is not None):
        raise UserError("--no-dp cannot be combined with --epsilon/--delta")
    if not no_dp and (epsilon is None or delta is None):
        raise UserError("give both --epsilon and --delta, or --no-dp")
    if not no_dp and not (epsilon > 0 and 0 < delta < 1):
        raise UserError(f"need --epsilon > 0 and 0 < --delta < 1 (got {epsilon}, {delta})")


def register(app: typer.Typer) -> None:
    """Add ``privlm synth``."""

    @app.command("synth")
    def synth(
        model: str = typer.Option("smollm2-135m", "--model", help="registered name, local folder or hub id"),
        data: str | None = typer.Option(
            None, "--data", help="private dataset: rotten-tomatoes, jsonl:PATH, ... (its seeded train split is read)"),
        train: str | None = typer.Option(
            None, "--train", metavar="FILE", help="private file, .jsonl/.csv: the whole private set (instead of --data)"),
        labels: str | None = LABELS,
        template: str | None = TEMPLATE,
        per_class: int = typer.Option(..., "--per-class", help="synthetic examples per class"),
        out: Path = typer.Option(..., "--out", help="output FILE.jsonl (+ sidecar FILE.privacy.json)"),
        epsilon: float | None = typer.Option(None, "--epsilon", help="privacy budget ε of the whole output"),
        delta: float | None = typer.Option(None, "--delta", help="privacy parameter δ"),
        no_dp: bool = typer.Option(False, "--no-dp", help="no clipping, no noise: NOT private"),
        preset: str = typer.Option("paper", "--preset", help=f"one of {sorted(PRESETS)}"),
        private_per_class: int | None = typer.Option(
            None, "--private-per-class", help="cut the private set to the first N per class (default: all of it)"),
        release: str | None = typer.Option(
            None, "--release", help=f"released rows of the LM-head gradient: {' or '.join(RELEASES)} (default label-rows)"),
        optimizer: str | None = typer.Option(
            None, "--optimizer", help=f"{' or '.join(OPTIMIZERS)}: ADMM (the paper's) or generate-select"),
        source: str | None = typer.Option(
            None, "--source", help=f"select's public candidates: {' or '.join(SOURCES)} (word-like samples or "
            "the public LM's answers to a class instruction)"),
        instruction: str | None = typer.Option(
            None, "--instruction", help="--source instruct: instruction template naming the class by {label_name} "
            "or {label_word} ({prompt}: the verbalizer's prompt); default: the data's, as zero-shot's (public)"),
        contrastive: bool | None = typer.Option(
            None, "--contrastive/--no-contrastive", help="select: own class's match minus the best other class's"),
        oversample: float | None = typer.Option(None, "--oversample", help="candidates per kept example"),
        length: int | None = typer.Option(None, "--length", help="synthetic tokens per example (public)"),
        batch: int | None = typer.Option(None, "--batch", help="sequences per ADMM batch"),
        outer_steps: int | None = typer.Option(None, "--outer-steps"),
        inner_steps: int | None = typer.Option(None, "--inner-steps"),
        rho: float | None = typer.Option(None, "--rho"),
        top_k: int | None = typer.Option(None, "--top-k"),
        clip: float | None = typer.Option(None, "--clip", help="per-sample clipping norm C"),
        label_filter: bool = typer.Option(
            True, "--label-filter/--no-label-filter",
            help="drop candidates our public few-shot classifier labels differently (off: rank by matching loss only)"),
        class_context: bool = typer.Option(
            False, "--class-context",
            help="start and project each class after its own public demonstrations (default: all classes')"),
        seed: int | None = typer.Option(None, "--seed", help="seed of the synthetic batches (not of the noise)"),
        resume: bool = typer.Option(False, "--resume", help="reuse the saved DP release and finished batches"),
        json_out: bool = typer.Option(False, "--json", help="print a JSON summary"),
        method: str = typer.Option(
            "gradmm", "--method", help=f"{', '.join(SYNTH_METHODS)}: GRADMM, Private Evolution, DP fine-tune then generate"),
        iterations: int | None = typer.Option(None, "--iterations", help="pe: noisy histograms T (default 3)"),
        variations: int | None = typer.Option(None, "--variations", help="pe: rewrites per survivor (default 3)"),
        population: float | None = typer.Option(None, "--population", help="pe: candidates per output example (default 2)"),
        max_new_tokens: int | None = typer.Option(
            None, "--max-new-tokens", help="pe, dp-finetune: tokens per generated text (default 40)"),
        epochs: float | None = typer.Option(None, "--epochs", help="dp-finetune: DP-SGD epochs (default 1)"),
        lora_layers: int | None = typer.Option(
            None, "--lora-layers", help="dp-finetune: LoRA on the last N blocks (default 2)"),
    ) -> None:
        """Generate DP synthetic examples: last-layer gradient matching (GRADMM), Private Evolution, or DP fine-tuning then sampling."""
        from privlm.resources.datasets import data_spec
        from privlm.resources.models import load_model

        check_privacy_args(epsilon, delta, no_dp)
        if data is not None and train is not None:
            raise UserError("give --data NAME (its train split is private) or --train FILE (the whole private set), not both")
        spec, classes = data_spec(data, train), public_classes(labels, template)
        if method not in SYNTH_METHODS:
            raise UserError(f"--method {method!r} is not one of {', '.join(SYNTH_METHODS)}")
        if method != "gradmm":
            overrides = {"seed": seed, "max_new_tokens": max_new_tokens}
            overrides |= ({"iterations": iterations, "variations": variations, "population": population} if method == "pe"
                          else {"epochs": epochs, "lora_layers": lora_layers})
            run_method_command(method, model, spec, classes, per_class, out, epsilon, delta, private_per_class, resume,
                               json_out, {k: v for k, v in overrides.items() if v is not None})
            return
        config = make_config(
            preset, private_per_class=private_per_class, length=length, batch=batch, outer_steps=outer_steps,
            inner_steps=inner_steps, rho=rho, top_k=top_k, clip=clip, seed=seed, label_filter=label_filter,
            class_context=class_context, release=release, optimizer=optimizer, oversample=oversample,
            source=source, instruction=instruction, contrastive=contrastive,
        )
        loaded, tokenizer = load_model(model)
        result, wall_s = synthesize_with_progress(
            loaded, tokenizer, model_name=model, data=spec, per_class=per_class, config=config, dp=not no_dp,
            epsilon=epsilon, delta=delta, out=out, resume=resume, labels=classes,
        )
        if json_out:
            print_json(summary(result, out, wall_s))
        else:
            show_result(result, out, wall_s)


@dataclass(frozen=True)
class MethodRun:
    """A finished ``pe`` or ``dp-finetune`` run: its rows, the sidecar's privacy statement, the method's
    own facts for ``--json`` (``extra``), the line describing its mechanism, and its wall time."""

    method: str
    out: Path
    rows: list[dict[str, Any]]
    privacy: dict[str, Any]
    extra: dict[str, Any]
    detail: str
    wall_s: float


RUN_FOLDERS = {  # method -> (module, RunFolder subclass): imported on use, ``privlm --help`` stays light
    "gradmm": ("privlm.gradmm.pipeline", "RunPaths"),
    "pe": ("privlm.synthesis.pe.mechanism", "PEPaths"),
    "dp-finetune": ("privlm.synthesis.dp_finetune.mechanism", "DPFinetunePaths"),
}


def run_folder(method: str, out: Path) -> RunFolder:
    """The run folder beside ``out`` where ``method`` keeps its release (ledger, ``run.json``) for reuse."""
    module, name = RUN_FOLDERS[method]
    return getattr(importlib.import_module(module), name)(out)


def method_runner(
    method: str, model_name: str, data: str | DataSpec, labels: object, per_class: int, out: Path,
    epsilon: float | None, delta: float | None, private_per_class: int | None, resume: bool, overrides: dict[str, Any],
) -> Callable[[PreTrainedModel, PreTrainedTokenizerBase], MethodRun]:
    """Check a ``pe`` (Private Evolution) or ``dp-finetune`` (DP fine-tune, then generate) run on the train split
    (or its first N per class) before any model is loaded or anything written; returns the run, to call with
    the loaded model. ``privlm synth --method`` and ``privlm demo --methods`` both run through here."""
    from privlm.resources.datasets import load_dataset

    if per_class < 1:
        raise UserError(f"--per-class must be >= 1 (got {per_class})")
    if not out.parent.is_dir():
        raise UserError(f"output folder {out.parent} does not exist")
    dataset = load_dataset(data, split=None, seed=SPLIT_SEED, labels=labels)
    label_names = dataset.label_names  # public
    # the data's own class instructions (public: verbalizer + label names), as the experiment runner gives them
    overrides = {"instructions": dataset.verbalizer.instructions(label_names), **overrides}
    if method == "dp-finetune":
        from privlm.synthesis.dp_finetune.config import DPFinetuneConfig

        if epsilon is None:
            raise UserError("--method dp-finetune trains with DP-SGD: give --epsilon and --delta (not --no-dp)")
        config = DPFinetuneConfig(**overrides)
    else:
        from privlm.synthesis.pe.config import PEConfig

        config = PEConfig(**overrides)
    workdir = run_folder(method, out).workdir
    if workdir.exists() and not resume:
        raise UserError(f"{workdir} holds a run for {out}; pass --resume to continue or reuse it, or remove it")
    load_private = private_examples(data, private_per_class, labels)
    if private_per_class is not None or not resume:  # bad rows or a cut larger than a class: refused before anything is written
        load_private = load_private().copy
    settings = {"model": model_name, "data": str(data), "private_per_class": private_per_class}

    def run(loaded: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> MethodRun:
        start = time.perf_counter()
        with err_console.status(method) as status:
            if method == "pe":
                from privlm.synthesis.pe.mechanism import run_pe

                result = run_pe(loaded, tokenizer, label_names, load_private, out=out, per_class=per_class,
                                config=config, epsilon=epsilon, delta=delta, resume=resume, settings=settings,
                                on_phase=lambda text: status.update(text))
                extra, detail = ({"reused_histograms": result.reused_histograms},
                                 "{iterations} noisy histograms, σ = {noise_multiplier:.4f} votes")
            else:
                from privlm.synthesis.dp_finetune.mechanism import run_dp_finetune

                result = run_dp_finetune(
                    loaded, tokenizer, label_names, load_private, out=out, per_class=per_class, config=config,
                    epsilon=epsilon, delta=delta, run_dir=workdir, settings=settings,
                    on_progress=lambda step, total, loss, eps: status.update(f"DP-SGD step {step}/{total}"))
                extra, detail = {}, "DP-SGD, {norm_mode} norms, LoRA r{lora} on the last {lora_layers} blocks"
        return MethodRun(method, out, result.rows, result.privacy, extra, detail, time.perf_counter() - start)

    return run


def method_summary(run: MethodRun) -> dict[str, Any]:
    """A ``pe`` or ``dp-finetune`` run's ``--json`` output."""
    return {"out": str(run.out), "method": run.method, "rows": run.rows, "privacy": run.privacy, **run.extra,
            "wall_s": run.wall_s}


def show_method_run(run: MethodRun) -> None:
    """A ``pe`` or ``dp-finetune`` run's examples beside the privacy they cost."""
    print_rows(f"{run.method} synthetic examples ({run.out})", run.rows, "votes",
               lambda row: f"{row['noisy_votes']:.1f}" if "noisy_votes" in row else "")
    privacy = run.privacy
    if privacy["dp"]:
        console.print(f"privacy spent: (ε = {privacy['epsilon']:.4g}, δ = {privacy['delta']:.3g})-DP for the whole output ("
                      + run.detail.format(**privacy, **privacy.get("settings", {})) + ")")
    else:
        console.print(f"[bold red]{privacy['warning']}[/bold red]")
    console.print(f"{len(run.rows)} examples in {run.out} (sidecar {run.out.with_suffix('.privacy.json')}), "
                  f"{run.wall_s:.0f} s")


def run_method_command(
    method: str, model_name: str, data: DataSpec, labels: object, per_class: int, out: Path, epsilon: float | None,
    delta: float | None, private_per_class: int | None, resume: bool, json_out: bool, overrides: dict[str, Any],
) -> None:
    """``privlm synth --method pe`` (Private Evolution) or ``--method dp-finetune`` (DP fine-tune, then
    generate) on the train split (or its first N per class)."""
    from privlm.resources.models import load_model

    runner = method_runner(method, model_name, data, labels, per_class, out, epsilon, delta, private_per_class, resume,
                           overrides)
    run = runner(*load_model(model_name))
    if json_out:
        print_json(method_summary(run))
    else:
        show_method_run(run)
