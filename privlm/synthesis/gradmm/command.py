"""``privlm synth --method gradmm``: its options and run (:class:`~privlm.synthesis.command.SynthCommand`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from privlm.synthesis.command import SynthOption, SynthOutcome, SynthRequest, private_examples, public_label_names
from privlm.synthesis.gradmm.config import OPTIMIZERS, PRESETS, RELEASES, SELECTIONS, SOURCES

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from privlm.progress import Progress

OPTIONS = (
    SynthOption("--preset", "preset", str, f"one of {sorted(PRESETS)} (default paper)"),
    SynthOption(
        "--release",
        "release",
        str,
        f"released rows of the LM-head gradient: {' or '.join(RELEASES)} (default label-rows)",
    ),
    SynthOption("--optimizer", "optimizer", str, f"{' or '.join(OPTIMIZERS)}: ADMM (the paper's) or generate-select"),
    SynthOption(
        "--source",
        "source",
        str,
        f"select's public candidates: {' or '.join(SOURCES)} (word-like samples or the "
        "public LM's answers to a class instruction)",
    ),
    SynthOption(
        "--instruction",
        "instruction",
        str,
        "--source instruct: instruction template naming the class by "
        "{label_name} or {label_word} ({prompt}: the verbalizer's prompt); default: the data's, as zero-shot's (public)",
    ),
    SynthOption(
        "--contrastive/--no-contrastive", "contrastive", bool, "select: own class's match minus the best other class's"
    ),
    SynthOption(
        "--selection",
        "selection",
        str,
        f"select's rule: {' or '.join(SELECTIONS)} (greedy gradient matching, the default; or a uniform draw among "
        "the candidates the release's one-step head also gives their class)",
    ),
    SynthOption("--oversample", "oversample", float, "candidates per kept example"),
    SynthOption("--length", "length", int, "synthetic tokens per example (public)"),
    SynthOption("--batch", "batch", int, "sequences per ADMM batch"),
    SynthOption("--outer-steps", "outer_steps", int, "ADMM outer steps"),
    SynthOption("--inner-steps", "inner_steps", int, "Adam steps per ADMM outer step"),
    SynthOption("--rho", "rho", float, "ADMM penalty ρ"),
    SynthOption("--top-k", "top_k", int, "projection: candidate tokens per position"),
    SynthOption("--clip", "clip", float, "per-sample clipping norm C"),
    SynthOption(
        "--label-filter/--no-label-filter",
        "label_filter",
        bool,
        "drop candidates our public few-shot classifier labels differently (off: rank by matching loss only; default on)",
    ),
    SynthOption(
        "--class-context/--no-class-context",
        "class_context",
        bool,
        "start and project each class after its own public demonstrations (default: all classes')",
    ),
    SynthOption("--seed", "seed", int, "seed of the synthetic batches (not of the noise)"),
)


def prepare(request: SynthRequest) -> Callable[[PreTrainedModel, PreTrainedTokenizerBase, Progress], SynthOutcome]:
    """Check a GRADMM run (settings, output folder, private rows) before any model is loaded; the run."""
    from privlm.synthesis.gradmm.config import make_config
    from privlm.synthesis.gradmm.pipeline import GradmmPaths

    request.check_output()
    config = make_config(private_per_class=request.private_per_class, **request.options)  # its preset, else paper
    label_names, verbalizer = public_label_names(request)  # only the public verbalizer is read
    # --source instruct without --instruction: the verbalizer's instructions, as zero-shot's (None: its default)
    config = replace(config, instructions=verbalizer.instructions(label_names))
    load_private = private_examples(request.data, config.private_per_class, request.labels)
    if not GradmmPaths(request.out).release.exists():
        load_private = (
            load_private().copy
        )  # a cut larger than a class, or bad rows, are refused before anything is written

    def run(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, progress: Progress) -> SynthOutcome:
        from privlm.synthesis.gradmm.pipeline import run_gradmm
        from privlm.synthesis.gradmm.prompt import build_prompt

        start = time.perf_counter()
        model.requires_grad_(False)
        prompt = build_prompt(tokenizer, verbalizer.template, verbalizer.label_words, label_names)
        result = run_gradmm(
            model,
            tokenizer,
            prompt,
            load_private,
            out=request.out,
            per_class=request.per_class,
            config=config,
            dp=request.dp,
            epsilon=request.epsilon,
            delta=request.delta,
            resume=request.resume,
            settings={"model": request.model_name, "data": str(request.data)},
            progress=progress,
        )
        return SynthOutcome(
            "gradmm",
            request.out,
            result.rows,
            result.privacy,
            time.perf_counter() - start,
            extra={"reused_release": result.reused_release},
            detail="σ = {noise_multiplier:.4f}, C = {clip:g}; release {release_sha256:.16}"
            + (" (reused, no new privacy spent)" if result.reused_release else ""),
            notes=_notes(result.privacy),
            score=("match loss", lambda row: f"{row['match_loss']:.4f}"),
        )

    return run


def _notes(privacy: dict[str, Any]) -> tuple[str, ...]:
    """The private set's name (never its size) and how much of the release is signal."""
    if not privacy["dp"]:
        return ()
    rows = privacy["released_rows"]
    return (
        *([f"private set: {privacy['private_data']} (its size is not released)"] if "private_data" in privacy else []),
        f"[yellow]signal vs noise: the release keeps {'all' if rows == 'all' else len(rows)} rows of the LM-head "
        f"gradient ({privacy['released_dim_per_class']:,} coordinates per class); each class target carries noise "
        f"of norm ≈ {privacy['noise_norm_per_class']:,.0f}, and n private examples add at most "
        f"n·C = n·{privacy['clip']:g}: with fewer than ≈ {privacy['examples_per_class_to_match_noise']:,.0f} "
        "examples per class the target is mostly noise and the text depends on it little.[/yellow]",
    )


PLAN = (
    "release a differentially private per-class gradient of the model's last layer on the train split",
    "the public model answers each class's instruction (10 candidates per kept example; public text)",
    "keep per class the subset whose gradient best matches the release against the other class's (GRADMM "
    "generate-select); print them beside the privacy spent",
)
