"""The ``gradmm`` experiment method: DP synthetic text from :mod:`privlm.synthesis.gradmm`, one run per cell.

The private pool enters only through GRADMM's DP release (``load_private``); generation and
filtering see the release alone. The run lives in the cell's ``workdir`` and is always resumed:
a saved release is reused, never redrawn, so an interrupted experiment does not spend ε twice.
The pool's last-layer factors are computed once per experiment and kept in ``ctx.private_cache``
(private); each cell's release is then their clipped sum plus its own fresh noise.
Method parameters (TOML ``[methods.gradmm]``): ``preset`` (``paper`` or ``demo``) and any
:class:`privlm.synthesis.gradmm.config.GradmmConfig` field; the cell's seed sets ``seed``. ``noise_only = true``
(e.g. ``[methods."gradmm@noise"]``) is the noise-only control: pure noise at the cell's σ and C, no
private data read, ε spent 0.
Instructed public candidates (``source = "instruct"``) depend on the model, instruction, batch size and
seed only (without an ``instruction``: the dataset's verbalizer's, passed as ``instructions`` by the
experiment runner as to zero-shot generation; for rotten-tomatoes zero-shot's default): cells that share them (DP, noise-only, no-DP, every ε) read them from ``work/public-candidates``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from privlm.digest import digest
from privlm.errors import UserError
from privlm.synthesis.gradmm.config import GradmmConfig, make_config
from privlm.synthesis.gradmm.filtering import Candidate
from privlm.synthesis.gradmm.generate import batch_seed, candidate_jobs, instructed_batch, public_labels, unscored
from privlm.synthesis.gradmm.pipeline import run_gradmm
from privlm.synthesis.gradmm.prompt import Prompt, build_prompt
from privlm.synthesis.gradmm.release import model_fingerprint
from privlm.synthesis.registry import MethodContext


def public_candidates_dir(work: Path, model: PreTrainedModel, config: GradmmConfig, prompt: Prompt) -> Path:
    """Where an experiment's cells keep the instructed public candidates they share: ``work/public-candidates/
    <key>``, the key a digest of everything that shapes them (model, source, instruction, batch size, prompt and
    the verbalizer's instructions), so cells that would draw the same candidates find them and no others do.
    Public: nothing private enters the key or the folder."""
    key = {
        "model": model_fingerprint(model),
        "source": config.source,
        "instruction": config.instruction,
        "batch": config.batch,
        "prompt": prompt.to_dict(),
        # the data's verbalizer's instructions (user data); absent for the default, so its key is as before
        **({} if config.instructions is None else {"instructions": list(config.instructions)}),
    }
    return work / "public-candidates" / digest(key)


def factor_cache(private_cache: Path | None, prompt: Prompt, config: GradmmConfig) -> Path | None:
    """Where an experiment keeps its pool's last-layer factors for ``prompt`` and ``config.max_private_tokens``
    (PRIVATE: in the experiment's private cache; None without one): every cell that reads them shares one file."""
    if private_cache is None:
        return None
    key = digest({"prompt": prompt.to_dict(), "max_tokens": config.max_private_tokens})
    return private_cache / f"gradmm-factors-{key}.pt"


def public_pool(
    ctx: MethodContext, config: GradmmConfig, prompt: Prompt, task: str = "public candidates (instructed answers)"
) -> tuple[list[Candidate], list[int], Path]:
    """The instructed public candidates a GRADMM cell of ``config`` at ``ctx.n_per_class`` chooses among, in its
    order (so the label filter's kept pieces are the same), the public label filter's class for each (each its
    own class without ``label_filter``), and the shared folder they are kept in (generated there by whichever
    cell comes first). Public: reads neither the pool nor a release."""
    if config.source != "instruct":
        raise UserError(
            f"the public pool holds instructed candidates: the preset must use source 'instruct' (got {config.source!r})"
        )
    public_dir = public_candidates_dir(ctx.workdir.parent, ctx.model, config, prompt)
    public_dir.mkdir(parents=True, exist_ok=True)
    jobs = candidate_jobs(ctx.n_per_class, config, len(ctx.label_names))
    shown = ctx.progress.task(task, total=len(jobs))
    candidates: list[Candidate] = []
    for k, j in jobs:
        ids = instructed_batch(
            ctx.model, ctx.tokenizer, prompt, k, config, batch_seed(config.candidate_seed, k, j), public_dir
        )
        candidates += unscored(ctx.tokenizer, ids, k)
        shown.advance()
    shown.done()
    if not config.label_filter:
        return candidates, [c.label for c in candidates], public_dir
    return candidates, public_labels(ctx.model, ctx.tokenizer, prompt, candidates, public_dir), public_dir


def gradmm_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """Synthesize ``n_per_class`` examples per class (fewer if filtering runs short) at the cell's ε."""
    params = dict(ctx.params)
    config = make_config(params.pop("preset", "paper"), **params, seed=ctx.seed)
    model = copy.deepcopy(ctx.model).requires_grad_(False)  # GRADMM differentiates the inputs only
    prompt = build_prompt(ctx.tokenizer, ctx.template, ctx.label_words, ctx.label_names)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    dp = ctx.epsilon is not None
    result = run_gradmm(
        model,
        ctx.tokenizer,
        prompt,
        lambda: list(ctx.pool),
        out=ctx.out,
        per_class=ctx.n_per_class,
        config=config,
        dp=dp,
        epsilon=ctx.epsilon,
        delta=ctx.delta if dp else None,
        resume=True,
        factor_cache=factor_cache(ctx.private_cache, prompt, config),
        public_dir=public_candidates_dir(ctx.workdir.parent, model, config, prompt),
    )
    return [{**row, "epsilon_spent": result.privacy["epsilon"]} for row in result.rows]
