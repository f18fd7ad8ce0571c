"""The first run: both capabilities of privlm on one pass over the private data, in minutes.

``run_demo`` takes a fixed, public-sized subset of a built-in data set's train split as the private set
and does, in order:

1. **One forward pass over the private set** (:func:`private_pass`): the final hidden state ``h_i`` at
   the position that predicts the label word, for every private example, in fixed public shapes (each
   row's ``h_i`` is a function of that row alone: :func:`privlm.synthesis.gradmm.release.private_factors`),
   cached in the demo folder (PRIVATE, bound to the rows and the model by a key, rebuilt on mismatch).
   Both private steps read it and nothing else of the private data: the DP fine-tune trains the
   label-word rows of the output layer on these features, and GRADMM's label-row release is the clipped,
   noised sum of the per-example gradients ``(p_i − e_{y_i}) h_iᵀ`` of those same rows. The two prompts
   coincide (GRADMM's ``document start + text + " It was"``), so the one pass serves both.
2. **DP fine-tuning** (head-only, DP-SGD on the cached features) at ``finetune_epsilon``, beside the
   untrained model (the label words' zero-shot scores) and the same recipe without noise.
3. **DP synthetic text** (GRADMM generate–select on instructed public candidates, the configuration that
   beat its noise-only control in the studies) at ``synth_epsilon``, beside its noise-only control (a
   release of pure noise at the same σ: no private data read), zero-shot synthetic text of the same size
   (the first answers of the public model to the same class instructions) and a random real subset of
   the same size (non-private).
4. **Evaluation**: every training set is scored the same way, a head-only classifier trained on its
   features (the features of synthetic texts are computed from the texts, which are DP or public), on the
   same test subset, with 95 % bootstrap intervals.

The privacy of everything the demo prints is the composition of the two releases' ledgers (the DP-SGD
steps and GRADMM's per-class Gaussian release): :func:`composed_privacy` composes them with the PLD
accountant and also gives the basic-composition sum of the two targets. Not covered: the non-private
references (they train on the private data directly, by design), the test scores (the test split is
scored directly) and wall times.

A second run with the same settings reuses the cached pass, the saved DP head with its ledger and
GRADMM's release and batches: it draws nothing and spends no new ε.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.atomic import atomic_path, write_text_atomic
from privlm.digest import digest
from privlm.errors import UserError
from privlm.evaluation.compare import matched_random_subset
from privlm.privacy.ledger import Ledger
from privlm.privacy.validation import check_delta, check_epsilon
from privlm.progress import Progress
from privlm.resources.datasets import BUILTIN, load_dataset
from privlm.synthesis.gradmm.config import PRESETS, GradmmConfig
from privlm.synthesis.gradmm.generate import instructed_pool
from privlm.synthesis.gradmm.pipeline import GradmmPaths, run_gradmm
from privlm.synthesis.gradmm.prompt import Prompt, build_prompt
from privlm.synthesis.gradmm.release import PrivateFactors, head_fingerprint, private_factors
from privlm.training.checkpoint import retire_checkpoints
from privlm.training.evaluate import classify_report
from privlm.training.head import LabelWordHead, head_losses
from privlm.training.loop import TrainConfig, prepare, train_loop
from privlm.training.prefix_cache import cached_rows, collate_cached

SPLIT_SEED = 0  # the data sets' standard seeded splits
LAYOUT = "demo-features v1"


@dataclass(frozen=True)
class DemoSettings:
    """What the demo runs; every field is public.

    ``private_rows``: the private set is the first ``private_rows`` examples of the seeded train split (a
    data-independent choice; the full studies use the whole split). ``test_rows``: the first test
    examples scored. ``per_class``: synthetic examples per class. ``finetune_epsilon`` /
    ``synth_epsilon``: the two releases' targets, each at δ = ``delta``/2, so together they are
    (ε₁ + ε₂, δ)-DP by basic composition (the PLD composition of their ledgers is tighter).
    ``head_lr``/``head_epochs``/``head_sample_rate``: the head-only recipe of the studies (chosen once on
    ``tweets``), used for every training set. ``seed``: public choices only (candidate sampling, the random
    real subset); never the noise, whose keys come from the OS."""

    model: str = "smollm2-135m"
    data: str = "rotten-tomatoes"
    private_rows: int = 4000
    test_rows: int = 500
    per_class: int = 20
    finetune_epsilon: float = 1.0
    synth_epsilon: float = 3.0
    delta: float = 1e-5
    head_lr: float = 0.01
    head_epochs: float = 40.0
    head_sample_rate: float = 0.0606
    seed: int = 0

    def __post_init__(self) -> None:
        if self.data not in BUILTIN:
            raise UserError(f"the demo runs on a built-in data set ({', '.join(BUILTIN)}), got {self.data!r}")
        for name in ("private_rows", "test_rows", "per_class"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        check_epsilon(self.finetune_epsilon, "--finetune-epsilon")
        check_epsilon(self.synth_epsilon, "--synth-epsilon")
        check_delta(self.delta, "--delta")

    @property
    def share_delta(self) -> float:
        """δ of each of the two releases."""
        return self.delta / 2

    @property
    def gradmm_config(self) -> GradmmConfig:
        """GRADMM's ``instruct`` preset (generate–select over instructed candidates, contrastive)."""
        return replace(PRESETS["instruct"], seed=self.seed)


@dataclass(frozen=True)
class DemoData:
    """The demo's public prompt, private train rows and test rows (``(text, class)`` each)."""

    prompt: Prompt
    label_names: tuple[str, ...]
    instructions: tuple[str, ...]
    private: tuple[tuple[str, int], ...]
    test: tuple[tuple[str, int], ...]


def cuts(settings: DemoSettings) -> list[str]:
    """What the demo cuts compared with the full studies, one line each (sizes of built-in data are public)."""
    sizes = load_dataset(settings.data).split_sizes
    candidates = round(settings.per_class * settings.gradmm_config.oversample)
    return [
        f"private set: the first {settings.private_rows:,} of the {sizes['train']:,} train examples (the studies: all)",
        f"test: the first {settings.test_rows:,} of the {sizes['test']:,} test examples (the studies: all)",
        f"synthetic sets: {settings.per_class} per class, selected from {candidates} public candidates per class "
        "(the studies: up to 100 per class)",
        "evaluation: a head-only classifier on each set's features (the studies also fine-tune the model on the sets)",
    ]


def demo_data(settings: DemoSettings, tokenizer: PreTrainedTokenizerBase) -> DemoData:
    """The private subset (first rows of the seeded train split) and test subset, and the public prompt.

    Raises :class:`UserError` when the split is smaller than asked (the sizes of built-in data sets are public)."""
    train = load_dataset(settings.data, split="train", seed=SPLIT_SEED)
    test = load_dataset(settings.data, split="test", seed=SPLIT_SEED)
    if len(train) < settings.private_rows or len(test) < settings.test_rows:
        raise UserError(
            f"{settings.data} has {len(train)} train and {len(test)} test examples; asked for "
            f"{settings.private_rows} and {settings.test_rows}"
        )
    verbalizer = train.verbalizer
    prompt = build_prompt(tokenizer, verbalizer.template, verbalizer.label_words, train.label_names)
    return DemoData(
        prompt,
        tuple(train.label_names),
        tuple(verbalizer.instructions(train.label_names) or ()),
        tuple(train.examples[: settings.private_rows]),
        tuple(test.examples[: settings.test_rows]),
    )


def cached_pass(
    path: Path,
    fingerprint: str,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[tuple[str, int]],
    prompt: Prompt,
    max_tokens: int,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[PrivateFactors, bool]:
    """``h_i`` and classes of ``rows`` (:func:`private_factors`), read from ``path`` when its key matches
    (rows, the model's ``fingerprint``, prompt, ``max_tokens``, layout), else computed and saved with the key.
    Returns the factors
    and whether they were read. PRIVATE when ``rows`` are: the file is as sensitive as the texts."""
    key = {
        "rows": digest([list(r) for r in rows]),
        "model": fingerprint,
        "prompt": digest(prompt.to_dict()),
        "max_tokens": max_tokens,
        "layout": LAYOUT,
    }
    key_file = path.with_suffix(".key.json")
    if path.exists() and key_file.exists() and json.loads(key_file.read_text()) == key:
        return PrivateFactors.load(path), True
    factors = private_factors(model, tokenizer, rows, prompt, max_tokens=max_tokens, on_batch=on_batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    factors.save(path)
    write_text_atomic(key_file, json.dumps(key, sort_keys=True) + "\n")
    return factors, False


def head_config(settings: DemoSettings, n: int, epsilon: float | None) -> TrainConfig:
    """The head-only recipe for ``n`` training rows: DP at ``epsilon`` (δ = ``settings.share_delta``), or
    without noise when ``epsilon`` is None. Expected batch q·n (at least 1)."""
    batch = max(1, round(settings.head_sample_rate * n))
    common = {"task": "classify", "head_only": True, "cache": None, "lr": settings.head_lr}
    common.update(epochs=settings.head_epochs, batch_size=batch, checkpoint_every=10**6, log_every=50)
    if epsilon is None:
        return TrainConfig(private=False, seed=settings.seed, **common)
    return TrainConfig(epsilon=epsilon, delta=settings.share_delta, norm_mode="mixed", **common)


def fit_head(
    model: PreTrainedModel,
    label_ids: Sequence[int],
    features: PrivateFactors,
    config: TrainConfig,
    run_dir: Path | None = None,
    on_progress: Callable[[int, int, float | None, float | None], None] | None = None,
) -> LabelWordHead:
    """A label-word head trained with ``config`` on ``features`` (rows ``(h_i, y_i)``); with ``run_dir``,
    the DP run's ledger, metrics and checkpoints go there (the checkpoints are removed at the end: they
    hold the noise state)."""
    head = LabelWordHead(model, list(label_ids))
    rows = cached_rows(features.hidden.to(head.rows.weight.dtype), features.labels.tolist())
    run = prepare(head, rows, collate_cached, config, loss_fn=head_losses)
    train_loop(run, run_dir, False, on_progress)
    if run_dir is not None:
        retire_checkpoints(run_dir)
    head.eval()
    return head


def score_head(head: LabelWordHead, test: PrivateFactors) -> dict[str, Any]:
    """Test accuracy (95 % bootstrap interval) of ``head`` on the test features."""
    with torch.inference_mode():
        scores = torch.log_softmax(head({"features": test.hidden.to(head.rows.weight.dtype)}).double(), dim=1)
    metrics, _ = classify_report(scores.numpy(), test.labels.tolist())
    return metrics


def dp_finetune(
    settings: DemoSettings,
    model: PreTrainedModel,
    label_ids: Sequence[int],
    features: PrivateFactors,
    run_dir: Path,
    on_progress: Callable[[int, int, float | None, float | None], None] | None = None,
) -> tuple[LabelWordHead, Ledger, bool]:
    """The DP head (ε = ``finetune_epsilon``) and its ledger; a finished run in ``run_dir`` (its head and
    ledger saved, same settings) is reused without training. Returns whether it was reused."""
    config = head_config(settings, len(features.labels), settings.finetune_epsilon)
    done, weights = run_dir / "finished.json", run_dir / "head.safetensors"
    settings_key = {"config": config.resume_key(), "features": len(features.labels)}
    if done.exists() and weights.exists() and json.loads(done.read_text()) == settings_key:
        head = LabelWordHead(model, list(label_ids))
        with torch.no_grad():
            head.rows.weight.copy_(load_file(weights)["rows"])
        return head.eval(), Ledger.load(run_dir / "privacy.json"), True
    if (run_dir / "privacy.json").exists():
        raise UserError(
            f"{run_dir} holds an unfinished or different DP fine-tune (its ledger counts); remove the demo "
            "folder or give another --out (removing it does not refund what it spent)"
        )
    head = fit_head(model, label_ids, features, config, run_dir, on_progress)
    with atomic_path(weights) as tmp:
        save_file({"rows": head.rows.weight.detach().contiguous()}, str(tmp))
    write_text_atomic(done, json.dumps(settings_key, sort_keys=True) + "\n")
    return head, Ledger.load(run_dir / "privacy.json"), False


def zero_shot_texts(public_dir: Path, tokenizer: PreTrainedTokenizerBase, n_classes: int, per_class: int) -> list:
    """Zero-shot synthetic text: the first ``per_class`` public answers to each class's instruction (the
    candidates GRADMM selected from, before any selection or filter). Public: no release is read."""
    rows = []
    for label in range(n_classes):
        pool = instructed_pool(public_dir, label)
        texts = [tokenizer.decode(ids).strip() for ids in pool]
        rows += [(t, label) for t in texts if t][:per_class]
    return rows


def composed_privacy(ledgers: dict[str, Ledger], delta: float, targets: dict[str, float]) -> dict[str, Any]:
    """ε at ``delta`` of all ``ledgers`` composed (PLD over their entries), each ledger's own ε at its
    share of δ, and the basic-composition bound (the sum of the targets)."""
    entries = tuple(e for ledger in ledgers.values() for e in ledger.entries)
    share = delta / len(ledgers)
    return {
        "delta": delta,
        "epsilon_composed_pld": Ledger(entries).epsilon(delta),
        "epsilon_basic_composition": sum(targets.values()),
        "releases": {
            name: {"target_epsilon": targets[name], "delta": share, "epsilon": ledger.epsilon(share)}
            for name, ledger in ledgers.items()
        },
    }


def _never_called() -> Sequence[tuple[str, int]]:
    raise RuntimeError("the demo's GRADMM release must read the one cached pass, not the private rows again")


def run_demo(
    settings: DemoSettings,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out: Path,
    progress: Progress,
) -> dict[str, Any]:
    """Run the demo into the folder ``out`` (module docstring) and return its JSON-ready report.

    Raises :class:`UserError` for bad settings, a data set too small for them, or a folder that holds a
    different or unfinished DP release (its privacy is spent and counted; it is never silently redone)."""
    model.requires_grad_(False)
    data = demo_data(settings, tokenizer)
    label_ids = list(data.prompt.label_token_ids)
    config = replace(settings.gradmm_config, instructions=data.instructions or None)
    out.mkdir(parents=True, exist_ok=True)
    fingerprint = head_fingerprint(model)  # one hash of the LM head, shared by every cache key
    report: dict[str, Any] = {"settings": asdict(settings), "stages": {}}

    def stage(name: str) -> Callable[[], None]:
        start = time.perf_counter()

        def end() -> None:
            report["stages"][name] = round(time.perf_counter() - start, 1)

        return end

    end = stage("private pass")
    task = progress.task(f"one forward pass over the {len(data.private)} private sentences", len(data.private))
    private, reused_pass = cached_pass(
        out / "private-features.pt",
        fingerprint,
        model,
        tokenizer,
        data.private,
        data.prompt,
        config.max_private_tokens,
        task.advance,
    )
    task.done()
    task = progress.task(f"features of the {len(data.test)} test sentences", len(data.test))
    test, _ = cached_pass(
        out / "test-features.pt",
        fingerprint,
        model,
        tokenizer,
        data.test,
        data.prompt,
        config.max_private_tokens,
        task.advance,
    )
    task.done()
    end()
    report["reused_private_pass"] = reused_pass

    end = stage("DP fine-tune")
    untrained = LabelWordHead(model, label_ids).eval()
    steps = progress.task(f"DP fine-tune of the label-word head (ε = {settings.finetune_epsilon:g})")
    dp_head, ft_ledger, reused_ft = dp_finetune(
        settings,
        model,
        label_ids,
        private,
        out / "dp-finetune",
        lambda step, total, loss, eps: steps.update(completed=step, total=total),
    )
    steps.done()
    task = progress.task("non-private fine-tune of the same head (reference)")
    plain_head = fit_head(model, label_ids, private, head_config(settings, len(private.labels), None))
    task.done()
    end()
    finetune = {
        "untrained": score_head(untrained, test),
        "dp": score_head(dp_head, test),
        "non_private": score_head(plain_head, test),
        "reused": reused_ft,
        "n_private": len(private.labels),
    }

    end = stage("DP synthetic text")
    sets: dict[str, list[tuple[str, int]]] = {}
    outcomes: dict[str, dict[str, Any]] = {}
    public_dir = out / "public-candidates"
    for name, noise_only in (("gradmm", False), ("noise_only", True)):
        (out / name).mkdir(exist_ok=True)
        result = run_gradmm(
            model,
            tokenizer,
            data.prompt,
            _never_called,
            out=out / name / "synthetic.jsonl",
            per_class=settings.per_class,
            config=replace(config, noise_only=noise_only),
            dp=True,
            epsilon=settings.synth_epsilon,
            delta=settings.share_delta,
            resume=True,
            settings={"model": settings.model, "data": settings.data, "private_rows": settings.private_rows},
            factor_cache=out / "private-features.pt",
            public_dir=public_dir,
            progress=progress,
        )
        sets[name] = [(row["text"], int(row["label"])) for row in result.rows]
        outcomes[name] = {"reused_release": result.reused_release, "privacy": result.privacy}
    sets["zero_shot"] = zero_shot_texts(public_dir, tokenizer, len(label_ids), settings.per_class)
    counts = {label: settings.per_class for label in range(len(label_ids))}
    sets["random_real"] = matched_random_subset(data.private, counts, settings.seed)  # a NON-PRIVATE reference
    end()

    end = stage("evaluation")
    task = progress.task("head-only classifier on each training set", len(sets))
    synthetic: dict[str, dict[str, Any]] = {}
    for name, rows in sets.items():
        if rows:
            features, _ = cached_pass(
                out / "eval" / f"{name}-features.pt",
                fingerprint,
                model,
                tokenizer,
                rows,
                data.prompt,
                config.max_private_tokens,
            )
            head = fit_head(model, label_ids, features, head_config(settings, len(rows), None))
            synthetic[name] = {**score_head(head, test), "n_train": len(rows)}
        else:
            synthetic[name] = {"accuracy": None, "n_train": 0}
        task.advance()
    task.done()
    end()

    ledgers = {"dp_finetune": ft_ledger, "gradmm": Ledger.load(GradmmPaths(out / "gradmm" / "synthetic.jsonl").ledger)}
    report.update(
        finetune=finetune,
        synthetic=synthetic,
        gradmm=outcomes,
        examples={name: [t for t, _ in rows[:3]] for name, rows in sets.items() if name != "random_real"},
        privacy=composed_privacy(
            ledgers, settings.delta, {"dp_finetune": settings.finetune_epsilon, "gradmm": settings.synth_epsilon}
        ),
        new_privacy_spent=not (reused_ft and outcomes["gradmm"]["reused_release"]),
        label_names=list(data.label_names),
    )
    write_text_atomic(out / "demo.json", json.dumps(report, indent=2, default=_jsonable) + "\n")
    return report


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
