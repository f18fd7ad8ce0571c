"""``privlm synth --method dp-finetune``: its options and run (:class:`~privlm.synthesis.command.SynthCommand`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from privlm.synthesis.command import SynthOption, SynthOutcome, SynthRequest, public_label_names

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from privlm.progress import Progress

OPTIONS = (
    SynthOption("--epochs", "epochs", float, "DP-SGD epochs (default 1)"),
    SynthOption("--lora-layers", "lora_layers", int, "LoRA on the last N blocks (default 2)"),
    SynthOption("--max-new-tokens", "max_new_tokens", int, "tokens per generated text (default 40)"),
    SynthOption("--seed", "seed", int, "seed of training order and sampling (not of the noise)"),
)


def prepare(request: SynthRequest) -> Callable[[PreTrainedModel, PreTrainedTokenizerBase, Progress], SynthOutcome]:
    """Check a DP fine-tune-then-generate run before any model is loaded or anything written; the run."""
    from privlm.errors import UserError
    from privlm.progress import shown_steps
    from privlm.synthesis.dp_finetune.config import DPFinetuneConfig
    from privlm.synthesis.dp_finetune.mechanism import DPFinetunePaths, run_dp_finetune

    request.check_output()
    if request.epsilon is None or request.delta is None:
        raise UserError("--method dp-finetune trains with DP-SGD: give --epsilon and --delta (not --no-dp)")
    label_names, verbalizer = public_label_names(request)
    config = DPFinetuneConfig(**{"instructions": verbalizer.instructions(label_names), **request.options})
    workdir = DPFinetunePaths(request.out).workdir
    load_private = request.private_loader(workdir)
    epsilon, delta = request.epsilon, request.delta

    def run(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, progress: Progress) -> SynthOutcome:
        start = time.perf_counter()
        training, on_progress = shown_steps(progress, epsilon)
        result = run_dp_finetune(
            model,
            tokenizer,
            label_names,
            load_private,
            out=request.out,
            per_class=request.per_class,
            config=config,
            epsilon=epsilon,
            delta=delta,
            run_dir=workdir,
            settings=request.settings(),
            on_progress=on_progress,
            progress=progress,
        )
        training.done()
        return SynthOutcome(
            "dp-finetune",
            request.out,
            result.rows,
            result.privacy,
            time.perf_counter() - start,
            detail="DP-SGD, {norm_mode} norms, LoRA r{lora} on the last {lora_layers} blocks",
            score=("votes", lambda row: ""),
        )

    return run


PLAN = (
    (
        "fine-tune LoRA adapters on the private examples with DP-SGD, then sample synthetic examples "
        "from the trained model; print them beside the privacy spent"
    ),
)
