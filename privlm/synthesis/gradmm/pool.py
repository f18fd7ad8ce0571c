"""The experiment's shared inputs of GRADMM's generate–select and the methods that choose from the same pool
(``instruct-pool``, ``dp-head-pool``): where the public candidates are kept, the candidates and their public
label-filter verdicts, and where the private pool's last-layer factors are cached."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

from privlm.digest import digest
from privlm.errors import UserError
from privlm.synthesis.gradmm.config import GradmmConfig
from privlm.synthesis.gradmm.filtering import Candidate
from privlm.synthesis.gradmm.generate import batch_seed, candidate_jobs, instructed_batch, public_labels, unscored
from privlm.synthesis.gradmm.prompt import Prompt
from privlm.synthesis.gradmm.release import head_fingerprint
from privlm.synthesis.registry import MethodContext


def public_candidates_dir(work: Path, model: PreTrainedModel, config: GradmmConfig, prompt: Prompt) -> Path:
    """Where an experiment's cells keep the instructed public candidates they share: ``work/public-candidates/
    <key>``, the key a digest of everything that shapes them (model, source, instruction, batch size, prompt and
    the verbalizer's instructions), so cells that would draw the same candidates find them and no others do.
    Public: nothing private enters the key or the folder."""
    key = {
        "model": head_fingerprint(model),
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
    return candidates, public_labels(ctx.model, ctx.tokenizer, prompt, candidates, public_dir, ctx.progress), public_dir
