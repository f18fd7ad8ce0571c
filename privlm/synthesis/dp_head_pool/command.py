"""``privlm synth --method dp-head-pool``: its options and run (:class:`~privlm.synthesis.command.SynthCommand`).

The run keeps everything in ``FILE.jsonl.dphead/`` (:class:`DPHeadPoolPaths`): the public candidates and their
label-filter verdicts (``public-candidates/``), the private examples' last-layer factors and the labeller's
DP-SGD run with its write-ahead ledger (PRIVATE: never share the folder). ``run.json`` binds the folder to the
run's public settings, so ``--resume`` reuses the one labeller it trained and never draws a second at other
settings; another ``--per-class`` on resume is a new draw among the candidates from the same labeller
(post-processing: no new ε).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from privlm.runfolder import RunFolder
from privlm.synthesis.command import SynthOption, SynthOutcome, SynthRequest, public_label_names

if TYPE_CHECKING:
    import numpy as np
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from privlm.progress import Progress
    from privlm.synthesis.registry import MethodContext

OPTIONS = (
    SynthOption("--epochs", "epochs", float, "the labeller's DP-SGD epochs (default 40)"),
    SynthOption("--batch-size", "batch_size", int, "the labeller's expected batch size (default 512)"),
    SynthOption("--lr", "lr", float, "the labeller's AdamW learning rate (default 0.01)"),
    SynthOption("--max-grad-norm", "max_grad_norm", float, "the labeller's per-sample clipping norm C (default 1)"),
    SynthOption("--oversample", "oversample", float, "candidates per kept example"),
    SynthOption(
        "--instruction",
        "instruction",
        str,
        "the candidates' instruction template naming the class by {label_name} or {label_word} ({prompt}: the "
        "verbalizer's prompt); default: the data's, as zero-shot's (public)",
    ),
    SynthOption(
        "--label-filter/--no-label-filter",
        "label_filter",
        bool,
        "drop candidates our public few-shot classifier labels differently (default on)",
    ),
    SynthOption("--seed", "seed", int, "seed of the public candidates and of the draw (not of the noise)"),
)
PLAN = (
    "the public model answers each class's instruction (candidates, kept where a public few-shot filter agrees)",
    "train the head-only classifier on the private examples with DP-SGD (the labeller: the run's ε)",
    "draw n per class among the candidates the labeller also gives their class (post-processing)",
)


class DPHeadPoolPaths(RunFolder):
    """The run folder of a run writing ``out``: ``FILE.jsonl.dphead/`` (module docstring)."""

    SUFFIX = ".dphead"


def _no_features() -> np.ndarray:
    """``MethodContext.pool_features`` of a ``privlm synth`` run: dp-head-pool reads the pool's factors in
    GRADMM's layout instead (:func:`~privlm.synthesis.gradmm.pipeline.load_factors`), never these."""
    raise AssertionError("dp-head-pool reads no pool features")


def prepare(request: SynthRequest) -> Callable[[PreTrainedModel, PreTrainedTokenizerBase, Progress], SynthOutcome]:
    """Check a dp-head-pool run before any model is loaded or anything written (the recipe, the candidate
    settings, the output folder, the private rows, the run folder's settings on ``--resume``); the run."""
    from privlm.errors import UserError
    from privlm.runfolder import check_or_write_settings
    from privlm.synthesis.dp_head_pool.labeller import LabellerConfig
    from privlm.synthesis.gradmm.config import make_config

    request.check_output()
    if request.epsilon is None or request.delta is None:
        raise UserError("--method dp-head-pool trains its labeller with DP-SGD: give --epsilon and --delta")
    labeller, options = LabellerConfig.split(request.options)
    epsilon, delta = request.epsilon, request.delta
    labeller.train_config(epsilon, delta)  # bad recipe values: refused now
    seed = options.pop("seed", 0)
    label_names, verbalizer = public_label_names(request)
    params = {"instructions": verbalizer.instructions(label_names), **options, **labeller.to_dict()}
    config = make_config("instruct", **options, instructions=params["instructions"], seed=seed)  # bad: refused now
    paths = DPHeadPoolPaths(request.out)
    load_private = request.private_loader(paths.workdir)
    settings = {  # all that keys the labeller's run (method.py) and shapes the candidates, defaults filled in
        **request.settings(),
        "epsilon": epsilon,
        "delta": delta,
        "labeller": labeller.to_dict(),
        "max_tokens": config.max_private_tokens,
        "candidates": {k: getattr(config, k) for k in ("oversample", "label_filter", "instruction", "batch")},
        "seed": seed,
    }
    if paths.manifest.exists():  # --resume (private_loader refused it otherwise): the same settings only
        check_or_write_settings(paths.manifest, settings)

    def _context(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, progress: Progress) -> MethodContext:
        from privlm.synthesis.registry import MethodContext

        return MethodContext(
            model=model,
            tokenizer=tokenizer,
            pool=load_private(),
            label_names=label_names,
            template=verbalizer.template,
            label_words=verbalizer.label_words,
            n_per_class=request.per_class,
            seed=seed,
            epsilon=epsilon,
            delta=delta,
            workdir=paths.workdir / "draw",  # its parent keeps the public candidates
            pool_features=_no_features,
            params=params,  # as the experiment runner gives them: the data's instructions, the options
            private_cache=paths.workdir,  # the factors and the labeller's run
            progress=progress,
        )

    def run(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, progress: Progress) -> SynthOutcome:
        from privlm.atomic import write_text_atomic
        from privlm.runfolder import hold
        from privlm.synthesis.dp_head_pool.method import choose

        start = time.perf_counter()
        with hold(paths.workdir):  # one process draws into the folder at a time
            check_or_write_settings(paths.manifest, settings)
            rows, privacy = choose(_context(model, tokenizer, progress), request.out)
            write_text_atomic(request.out, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        return SynthOutcome(
            "dp-head-pool",
            request.out,
            rows,
            privacy,
            time.perf_counter() - start,
            detail="DP-SGD of the head-only labeller: {labeller[epochs]:g} epochs, expected batch "
            "{labeller[batch_size]}, C = {labeller[max_grad_norm]:g}",
            score=("source", lambda row: "public candidate"),
        )

    return run
