"""DP fine-tune, then generate (Yue et al., ACL 2023; dp-transformers): DP synthetic text from a privately
trained generator.

DP-SGD (privlm's engine and training loop: Poisson sampling, per-sample clipping with ``hutchinson``
norms by default, the randomized-clipping PLD accountant, the write-ahead ledger, checkpoints and exact
resume) fine-tunes LoRA adapters on the last blocks of the public model on "public class prompt + text"
for every private example — the prompt is the zero-shot instruction of the example's class in the chat
template (:func:`privlm.lm.generation.chat_prompt`), and only the text tokens (and the end-of-turn
token) are targets. Then ``n`` texts per class are sampled from the trained model with the same public
prompts (:func:`privlm.synthesis.generation.baselines.zero_shot`), 100 at a time, each piece kept in
``run_dir/samples/`` as it is done: an interrupted sampling run resumes, and the cells that differ only in n
share their first pieces (n = 100's texts are the start of n = 1,000's).

**Guarantee**: the adapters (and the DP losses) are the training run's (ε, δ)-DP release under
add/remove-one adjacency (labels are part of the record, as in every privlm method); sampling from them
is post-processing, so the synthetic set is (ε, δ)-DP with the run's ε, whatever n. ``epsilon=None`` runs the
same recipe with σ = 0 (per-example clipping, no noise): NOT private, no ledger, a sidecar that says so; the
reference that tells what the noise costs from what the recipe itself can do. The prompts, the
LoRA initialisation (``seed``) and every setting are public. **CPU cuts** (the defaults): LoRA rank 8 on
the last 2 of 30 blocks only, texts cut to 48 tokens, one epoch at an expected batch of 256.

With ``cache`` (the default) the run takes privlm's top-blocks path (:mod:`privlm.training.top_blocks`): the
hidden states entering the first trained block are computed once per example into ``run_dir/prefix-cache/``
(private like the data, bound to the rows and the model by fingerprints, deleted with the checkpoints), and
each DP-SGD step runs only the trained blocks, the final norm and the output layer at the text's positions,
in micro-batches sorted by length. The per-sample losses, norms and clipped sums are those of the whole model
(``tests/training/test_top_blocks.py``), so the guarantee is unchanged; an epoch costs a fraction of one
through all 30 blocks, which is what lets the run take enough steps for its DP loss to fall. With
``shared_prefix`` (an experiment's private cache, one folder per private pool and model) the cache is built
once into ``shared_prefix/dpft-prefix-<digest>/`` (the digest of the public prompts, length bound, trained
blocks and dtype), kept there for every later run of other ε, seeds or σ, and built or read under a lock;
private like the data, it goes with that folder.

Files: the run folder ``run_dir`` (default ``FILE.jsonl.dpft/``) is privlm's training run folder
(``privacy.json``, ``metrics.jsonl``, checkpoints while training — they hold the noise keys — and
``adapter/`` at the end, when the checkpoints are deleted; ``samples/``: the texts sampled from the trained
model, piece by piece), plus ``run.json``, the public settings that
determine the adapters (ε, δ, the training config, the model's fingerprint and the caller's data spec and
``private_per_class``), written when the run starts. A run whose adapter is saved is reused, never
retrained, and an interrupted one resumes from its last checkpoint — both only if ``run.json`` matches
(else a :class:`UserError` naming the first differing key). The content of the private data is not bound
(a hash of it beside the release would let anyone test a guessed data set). The folder is locked
(``flock``, ``.lock``) while training or reloading: a second process gets a :class:`UserError`.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peft import PeftModel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.atomic import write_text_atomic
from privlm.digest import digest
from privlm.errors import UserError
from privlm.lm.generation import chat_prompt, class_instructions
from privlm.lm.prompts import EncodedOption, pad_token_id
from privlm.lm.sampling import Sampling
from privlm.privacy.ledger import Ledger
from privlm.progress import SILENT, Progress
from privlm.runfolder import (
    LEDGER,
    LOCK,
    MANIFEST,
    RunFolder,
    check_or_write_settings,
    claim,
    epsilon_statement,
    hold,
    sidecar_path,
)
from privlm.synthesis.dp_finetune.config import DPFinetuneConfig
from privlm.synthesis.generation.baselines import zero_shot
from privlm.synthesis.gradmm.release import head_fingerprint
from privlm.training import top_blocks
from privlm.training.checkpoint import FINISHED, retire_checkpoints
from privlm.training.data import make_collate
from privlm.training.loop import prepare, train_loop
from privlm.training.run import BuildProgress, save_model, with_lora

PREFIX_CACHE = "prefix-cache"  # inside the run folder: private, deleted with the checkpoints


@dataclass(frozen=True)
class DPFinetunePaths(RunFolder):
    """The default training run folder of a run writing ``out``: ``FILE.jsonl.dpft/`` (module docstring)."""

    SUFFIX = ".dpft"


def training_rows(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, int]],
    prefixes: Sequence[Sequence[int]],
    max_text_tokens: int,
) -> list[EncodedOption]:
    """Each example as ``prefixes[label]`` (the token ids of its class's public prompt: context) + its text cut
    to ``max_text_tokens`` tokens and the end-of-turn token (targets), so the trained model answers the public
    prompt with private-like text."""
    end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    rows = []
    for text, label in examples:
        if not 0 <= label < len(prefixes):
            raise UserError(f"label {label} out of range for {len(prefixes)} classes")
        target = tokenizer(text, add_special_tokens=False)["input_ids"][:max_text_tokens] + end
        rows.append(EncodedOption(list(prefixes[label]) + target, len(target)))
    return rows


def train_generator(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    label_names: Sequence[str],
    load_private: Callable[[], Sequence[tuple[str, int]]],
    *,
    config: DPFinetuneConfig,
    epsilon: float | None,
    delta: float,
    run_dir: Path,
    settings: dict[str, Any] | None = None,
    wait: bool = False,
    on_progress: Callable[[int, int, float | None, float | None], None] | None = None,
    progress: Progress | None = None,
    shared_prefix: Path | None = None,
) -> tuple[PreTrainedModel, Ledger | None]:
    """The DP fine-tuned copy of ``model`` (LoRA merged) and the run's ledger (None for ``epsilon=None``, the
    run without noise: module docstring): trained into ``run_dir`` (resumed
    from its last checkpoint), or its saved adapter reloaded without reading the data, with ``run_dir`` locked
    (``wait``: wait for another process holding it instead of refusing) and ``run.json`` checked against
    :func:`run_settings` (module docstring). ``progress``: where the prefix cache's build is shown (a private
    task: its count, the number of private examples, is never displayed). ``shared_prefix``: the folder whose
    prefix cache every run on the same private rows shares (module docstring); None: the run's own, deleted
    once the adapter is saved."""
    with hold(run_dir, wait=wait):
        _start(run_dir, run_settings(model, config, epsilon, delta, settings))
        base = copy.deepcopy(model)
        adapter = run_dir / "adapter"
        if (run_dir / FINISHED).exists() and adapter.is_dir():
            trained = PeftModel.from_pretrained(base, adapter)  # the saved release: the data is not read
            return trained.merge_and_unload().eval(), _ledger(run_dir, epsilon)
        prefixes = [
            tokenizer(chat_prompt(tokenizer, text), add_special_tokens=not tokenizer.chat_template)["input_ids"]
            for text in class_instructions(label_names, config.instructions)
        ]
        rows = training_rows(tokenizer, load_private(), prefixes, config.max_text_tokens)
        # a public bound (the longest prompt + the text cut + the end token), never the private rows' longest
        max_length = max(len(ids) for ids in prefixes) + config.max_text_tokens + 1
        context = model.config.max_position_embeddings
        if max_length > context:
            raise UserError(f"prompt + text of up to {max_length} tokens exceeds the model's context of {context}")
        train = config.train_config(epsilon, delta, max_length)
        module = with_lora(base, config.lora, config.seed, config.lora_layers)
        module.train()
        run_dir.mkdir(parents=True, exist_ok=True)
        cache_dir = run_dir / PREFIX_CACHE
        if shared_prefix is not None:
            public = {"prompts": prefixes, "max_length": max_length, "blocks": config.lora_layers, "dtype": train.cache}
            cache_dir = shared_prefix / f"dpft-prefix-{digest(public)}"
        if train.cache is not None:  # the frozen prefix once per example; each step runs the top blocks only
            build = BuildProgress(progress or SILENT, None)
            with claim(cache_dir.parent / f".{cache_dir.name}.lock", wait=True):  # one build, however many runs
                features = top_blocks.load_or_build(
                    cache_dir,
                    module,
                    config.lora_layers,
                    rows,
                    pad_token_id(tokenizer),
                    max_length,
                    train.cache,
                    on_build=build.on_build,
                    on_rows=build.on_rows,
                )
            build.done()
            top = top_blocks.cached_training(module, config.lora_layers, features, rows)
            run = prepare(
                top.module, top.rows, top.collate, train, loss_fn=top.loss_fn, micro_batches=top.micro_batches
            )
        else:
            run = prepare(module, rows, make_collate(tokenizer), train)
        train_loop(run, run_dir, resume=True, on_progress=on_progress)
        save_model(module, tokenizer, run_dir, lora=True)
        retire_checkpoints(run_dir)  # they hold the noise keys: never beside the release
        if shared_prefix is None:
            shutil.rmtree(cache_dir, ignore_errors=True)  # the private data's hidden states
        return module.merge_and_unload().eval(), _ledger(run_dir, epsilon)


def _ledger(run_dir: Path, epsilon: float | None) -> Ledger | None:
    """The finished run's ledger; None for the run without noise (it accounts nothing and writes none)."""
    return None if epsilon is None else Ledger.load(run_dir / LEDGER)


def run_settings(
    model: PreTrainedModel,
    config: DPFinetuneConfig,
    epsilon: float | None,
    delta: float,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """The public settings that determine the release (``run.json``): the caller's ``extra`` (data spec,
    ``private_per_class``), ε, δ, the training config and the model's fingerprint."""
    return {
        **(extra or {}),
        "epsilon": epsilon,
        "delta": delta,
        "training": config.training_dict(),
        "model_fingerprint": head_fingerprint(model),
    }


def _start(run_dir: Path, settings: dict[str, Any]) -> None:
    """Check a started run's ``run.json`` against ``settings``, or write it for a new run."""
    manifest = run_dir / MANIFEST
    if not manifest.exists() and any(path.name != LOCK for path in run_dir.iterdir()):
        raise UserError(
            f"{run_dir} holds a run without {MANIFEST} (an older privlm): its settings cannot be checked; remove it"
        )
    check_or_write_settings(manifest, settings)


@dataclass(frozen=True)
class DPFinetuneResult:
    """The sampled rows and the privacy statement written beside them."""

    rows: list[dict[str, Any]]
    privacy: dict[str, Any]


def run_dp_finetune(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    label_names: Sequence[str],
    load_private: Callable[[], Sequence[tuple[str, int]]],
    *,
    out: str | Path,
    per_class: int,
    config: DPFinetuneConfig,
    epsilon: float | None,
    delta: float,
    run_dir: Path | None = None,
    settings: dict[str, Any] | None = None,
    wait: bool = False,
    on_progress: Callable[[int, int, float | None, float | None], None] | None = None,
    progress: Progress | None = None,
    shared_prefix: Path | None = None,
) -> DPFinetuneResult:
    """Train (or reuse) the DP generator, sample ``per_class`` texts per class, write ``out`` and its
    ``.privacy.json`` sidecar (ε accounted from the run's ledger, never below the target). ``settings``: the
    caller's public settings bound to the run (:func:`run_settings`); ``wait``: see :func:`train_generator`.

    Args:
        model, tokenizer: the public LM fine-tuned (LoRA) with DP-SGD, then sampled.
        label_names: the public class names, in class-id order.
        load_private: returns the private ``(text, label)`` rows to train on.
        out: the JSONL file to write (its folder must exist).
        per_class: texts sampled per class (≥ 1).
        config: the DP-SGD run and sampling (:class:`DPFinetuneConfig`).
        epsilon, delta: the target of the DP-SGD run (``epsilon`` None: σ = 0, NOT private; module docstring).
        run_dir: the run folder (default: beside ``out``); a finished run with the same settings is reused.
        on_progress: ``on_progress(step, total, dp_loss, epsilon)`` after each DP-SGD step.
        progress: where the private prefix cache's build is shown (:func:`train_generator`).
        shared_prefix: the folder of a prefix cache shared by runs on the same private rows (:func:`train_generator`).

    Returns:
        :class:`DPFinetuneResult`: the sampled texts and the privacy statement written to the sidecar.

    Raises:
        UserError: a bad size, a missing output folder, invalid DP-SGD settings, or a run folder whose
            settings differ."""
    out = Path(out)
    if per_class < 1:
        raise UserError(f"--per-class must be >= 1 (got {per_class})")
    if not out.parent.is_dir():
        raise UserError(f"output folder {out.parent} does not exist")
    run_dir = run_dir or DPFinetunePaths(out).workdir
    generator, ledger = train_generator(
        model,
        tokenizer,
        label_names,
        load_private,
        config=config,
        epsilon=epsilon,
        delta=delta,
        run_dir=run_dir,
        settings=settings,
        wait=wait,
        on_progress=on_progress,
        progress=progress,
        shared_prefix=shared_prefix,
    )
    sampling = Sampling.from_params(config.to_dict())
    rows = [
        {**row, "method": "dp-finetune", "uses_private_data": True, "dp": ledger is not None}
        for row in zero_shot(
            generator,
            tokenizer,
            label_names,
            per_class,
            config.seed,
            instructions=config.instructions,
            sampling=sampling,
            keep=run_dir / "samples",
            progress=progress or SILENT,
        )
    ]
    noise = "no noise: σ = 0" if ledger is None else "Gaussian noise"
    privacy = {
        **_statement(ledger, epsilon, delta, run_dir, out),
        "settings": config.to_dict(),
        "mechanism": f"DP-SGD (Poisson sampling, per-sample clipping, {noise}; LoRA) on public class prompt + "
        "private text, then sampling from the trained model with the public prompts (post-processing)",
    }
    write_text_atomic(sidecar_path(out), json.dumps(privacy, indent=2, sort_keys=True) + "\n")
    write_text_atomic(out, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return DPFinetuneResult(rows, privacy)


def _statement(ledger: Ledger | None, epsilon: float | None, delta: float, run_dir: Path, out: Path) -> dict[str, Any]:
    """The sidecar's privacy part: the run's ε from its ledger, or NOT private for the run without noise."""
    if ledger is None or epsilon is None:
        return {
            "dp": False,
            "epsilon": None,
            "delta": None,
            "private_release": False,
            "warning": "DP-SGD's clipping without noise (σ = 0), a reference: nothing is accounted, and the output "
            "may reveal the private data",
        }
    return {
        **epsilon_statement(ledger, epsilon, delta, ledger_file=run_dir / LEDGER, sidecar=sidecar_path(out)),
        "private_release": ledger.private_release,
    }
