"""``privlm synth --method pe``: its options and run (:class:`~privlm.synthesis.command.SynthCommand`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from privlm.synthesis.command import SynthOption, SynthOutcome, SynthRequest, public_label_names

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from privlm.progress import Progress

OPTIONS = (
    SynthOption("--iterations", "iterations", int, "noisy histograms T (default 3)"),
    SynthOption("--variations", "variations", int, "rewrites per survivor (default 3)"),
    SynthOption("--population", "population", float, "candidates per output example (default 2)"),
    SynthOption("--max-new-tokens", "max_new_tokens", int, "tokens per generated text (default 40)"),
    SynthOption("--seed", "seed", int, "seed of the public generation (not of the noise)"),
)


def prepare(request: SynthRequest) -> Callable[[PreTrainedModel, PreTrainedTokenizerBase, Progress], SynthOutcome]:
    """Check a PE run before any model is loaded or anything written; the run."""
    from privlm.synthesis.pe.config import PEConfig
    from privlm.synthesis.pe.mechanism import PEPaths, run_pe

    request.check_output()
    label_names, verbalizer = public_label_names(request)
    # the data's own class instructions (public: verbalizer + label names), as the experiment runner gives them
    config = PEConfig(**{"instructions": verbalizer.instructions(label_names), **request.options})
    load_private = request.private_loader(PEPaths(request.out).workdir)

    def run(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, progress: Progress) -> SynthOutcome:
        start = time.perf_counter()
        result = run_pe(
            model,
            tokenizer,
            label_names,
            load_private,
            out=request.out,
            per_class=request.per_class,
            config=config,
            epsilon=request.epsilon if request.dp else None,
            delta=request.delta if request.dp else None,
            resume=request.resume,
            settings=request.settings(),
            progress=progress,
        )
        return SynthOutcome(
            "pe",
            request.out,
            result.rows,
            result.privacy,
            time.perf_counter() - start,
            extra={"reused_histograms": result.reused_histograms},
            detail="{iterations} noisy histograms, σ = {noise_multiplier:.4f} votes",
            score=("votes", lambda row: f"{row['noisy_votes']:.1f}" if "noisy_votes" in row else ""),
        )

    return run


PLAN = (
    (
        "Private Evolution: the public model writes candidates; noisy histograms of the private examples' "
        "nearest candidates pick which to keep and rewrite; print them beside the privacy spent"
    ),
)
