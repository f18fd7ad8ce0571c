"""Synthetic text from the DP release: candidate batches per class (ADMM, or public candidates for
generate–select: word-like samples or the public LM's answers to a class instruction), then filtering
and selection.

The wall: every function here takes the :class:`~privlm.synthesis.gradmm.release.Release` and public inputs
(model, tokenizer, settings, seeds) only — there is no parameter through which private data could
enter, so whatever they return is post-processing of the DP release. ADMM starts from text sampled
from the public LM (word-like tokens, seeded), never from a statistic of the private data. Each batch is seeded by
``(seed, class, batch index)`` alone, so batches can be computed in any order, on any rank, or again
after a crash, with identical results.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.atomic import json_once, write_text_atomic
from privlm.digest import digest
from privlm.errors import UserError
from privlm.lm.generation import chat_prompt, class_instructions, sample_texts
from privlm.lm.sampling import Sampling
from privlm.progress import SILENT, Progress
from privlm.resources.verbalizers import format_instructions
from privlm.synthesis.gradmm.admm import run_admm
from privlm.synthesis.gradmm.config import GradmmConfig
from privlm.synthesis.gradmm.filtering import CHUNK, Candidate, few_shot_context, few_shot_labels, select
from privlm.synthesis.gradmm.matching import autograd_matching_loss, matching_loss, per_example_matching_loss
from privlm.synthesis.gradmm.projection import Projector
from privlm.synthesis.gradmm.prompt import (
    Prompt,
    head_logits,
    head_weight,
    last_hidden_from_embeds,
    last_hidden_from_ids,
)
from privlm.synthesis.gradmm.release import Release, head_fingerprint
from privlm.synthesis.gradmm.release_filter import filter_select
from privlm.synthesis.gradmm.select import select_matching

LABEL_FILTER = "public label filter (candidates)"  # the progress task of public_labels
BATCHES = "GRADMM batches"  # the progress tasks of synthesize
ADMM_STEPS = "ADMM steps"
StepCallback = Callable[[int, int, float], None]
FILTER_STEP = "filter-step.json"  # in the batch folder: the step length the ``filter`` selection chose


def batch_seed(seed: int, label: int, index: int) -> int:
    """The seed of batch ``index`` of class ``label`` (public)."""
    return (seed * 1_000_003 + label * 10_007 + index) % (2**63)


def batches_per_class(per_class: int, config: GradmmConfig) -> int:
    """How many ADMM batches each class gets: enough for ``oversample × per_class`` candidates."""
    return math.ceil(per_class * config.oversample / config.batch)


def candidate_jobs(per_class: int, config: GradmmConfig, n_classes: int) -> list[tuple[int, int]]:
    """The (class, batch index) of every candidate batch, in the order the selection reads the candidates (batch
    by batch, class within batch): the order the public label filter's kept pieces depend on."""
    return [(k, j) for j in range(batches_per_class(per_class, config)) for k in range(n_classes)]


def unscored(tokenizer: PreTrainedTokenizerBase, ids: list[list[int]], label: int) -> list[Candidate]:
    """Public candidates of class ``label`` from their token ids, not yet scored (``match_loss`` None)."""
    return [Candidate(ids=tuple(i), text=tokenizer.decode(i).strip(), label=label, match_loss=None) for i in ids]


def wrap_in_prompt(model: PreTrainedModel, prompt: Prompt, x: torch.Tensor) -> torch.Tensor:
    """``[prefix, x, suffix]`` as input embeddings (B × (P + L + S) × d) for synthetic embeddings ``x``."""
    embedding = model.get_input_embeddings().weight.detach()
    prefix = embedding[list(prompt.prefix_ids)].expand(x.shape[0], -1, -1)
    suffix = embedding[list(prompt.suffix_ids)].expand(x.shape[0], -1, -1)
    return torch.cat([prefix, x, suffix], dim=1)


def make_objective(
    model: PreTrainedModel,
    prompt: Prompt,
    label_token: int,
    target: torch.Tensor,
    closed_form: bool = True,
    rows: Sequence[int] | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The ADMM objective ``X ↦ 1 − cos(target, G_syn(X))`` for synthetic embeddings X (B × L × d),
    in the released ``rows`` (None: all; target |R| × d).

    ``closed_form=False`` gives the autograd double-backward version (benchmark reference only, all rows).
    """
    if not closed_form and rows is not None:
        raise ValueError("the double-backward reference matches all rows only")

    def objective(x: torch.Tensor) -> torch.Tensor:
        hidden = last_hidden_from_embeds(model, wrap_in_prompt(model, prompt, x))
        if closed_form:
            return matching_loss(hidden, head_logits(model, hidden), label_token, target, rows)
        return autograd_matching_loss(hidden, head_weight(model), label_token, target)

    return objective


def projection_context(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, label: int | None = None) -> tuple[int, ...]:
    """What the LM conditions on when projecting and sampling: the document prefix followed by our
    public few-shot demonstrations (:func:`~privlm.synthesis.gradmm.filtering.few_shot_context`), so the
    decoded text reads like the task's domain — with ``label``, only that class's demonstrations, so it
    also reads like the class. Public; the matching itself sees ``prefix + text + suffix``."""
    demos = tokenizer.encode(few_shot_context(prompt, only=label), add_special_tokens=False)
    return prompt.with_context(demos)


def instructions_for(prompt: Prompt, config: GradmmConfig) -> list[str]:
    """The public instruction of each class for instructed candidates: ``config.instruction`` formatted
    for each class with the verbalizer's fields (:func:`~privlm.resources.verbalizers.format_instructions`),
    else ``config.instructions`` (the data's verbalizer's, as zero-shot generation gets them), else
    zero-shot's default. Raises :class:`UserError` when ``config.instructions`` does not give one per class."""
    if config.instruction is not None:
        return format_instructions(config.instruction, prompt.template, prompt.label_names, prompt.label_words)
    return class_instructions(prompt.label_names, config.instructions)


def instructed_ids(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, instruction: str, config: GradmmConfig, seed: int
) -> list[list[int]]:
    """``config.batch`` answers of the public LM to the class's ``instruction``, tokenized: zero-shot
    generation's prompt (chat template) and sampling, seeded by ``seed``. Public: no release is read."""
    texts = sample_texts(model, tokenizer, chat_prompt(tokenizer, instruction), config.batch, seed, Sampling())
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def instructed_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    label: int,
    config: GradmmConfig,
    seed: int,
    public_dir: Path | None = None,
) -> list[list[int]]:
    """One batch of instructed answers for class ``label`` (:func:`instructed_ids` with the class's instruction),
    kept in ``public_dir`` as ``class{label}_seed{seed}.json`` when given, and read from there if it exists:
    cells that select from the same public candidates generate them once. Public: no release is read."""
    path = None if public_dir is None else public_dir / f"class{label}_seed{seed}.json"
    instruction = instructions_for(prompt, config)[label]
    return json_once(path, lambda: instructed_ids(model, tokenizer, instruction, config, seed))


def instructed_pool(public_dir: Path, label: int) -> list[list[int]]:
    """The instructed public candidates of class ``label`` kept in ``public_dir`` by :func:`generate_batch`,
    batch by batch in seed order (token ids). Public: answers of the public LM to a public instruction."""
    files = sorted(public_dir.glob(f"class{label}_seed*.json"), key=lambda f: int(f.stem.rsplit("seed", 1)[1]))
    return [ids for f in files for ids in json.loads(f.read_text())]


def public_labels(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    candidates: Sequence[Candidate],
    public_dir: Path | None = None,
    progress: Progress = SILENT,
) -> list[int]:
    """The public few-shot classifier's label of each candidate (:func:`few_shot_labels`), kept in
    ``public_dir`` when given: a function of the public model, prompt and candidate texts only, so the cells
    that select from one seed's instructed candidates (DP, noise-only, no-DP, each ε) compute it once. Kept
    in pieces of :data:`~privlm.synthesis.gradmm.filtering.CHUNK` candidates, each saved as it is done: an interrupted pass over a large pool
    resumes, and a pool that extends another (n = 1,000's candidates begin with n = 100's) reuses its full
    pieces. The pieces start at multiples of the classifier's batch size, so the labels are those of one pass.
    Shown on ``progress`` as :data:`LABEL_FILTER` (public counts: the candidates are public)."""
    texts = [c.text for c in candidates]
    shown = progress.task(LABEL_FILTER, total=len(texts))
    fingerprint = head_fingerprint(model)
    labels: list[int] = []
    for start in range(0, len(texts), CHUNK):
        part = texts[start : start + CHUNK]
        key = digest({"model": fingerprint, "prompt": prompt.to_dict(), "texts": part})
        path = None if public_dir is None else public_dir / f"labels-{key}.json"
        labels += json_once(path, lambda part=part: few_shot_labels(model, tokenizer, prompt, part))
        shown.advance(len(part))
    shown.done()
    return labels


def generate_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    release: Release,
    projector: Callable[[], Projector],
    label: int,
    config: GradmmConfig,
    seed: int,
    on_step: StepCallback | None = None,
    public_dir: Path | None = None,
) -> list[Candidate]:
    """One batch of ``config.batch`` candidates for class ``label``: a seeded public sample optimized by ADMM
    (``optimizer = "admm"``), each with its matching loss against ``release.targets[label]``, or public
    candidates kept as they are and not yet scored (``"select"``: no forward pass here;
    :func:`~privlm.synthesis.gradmm.select.select_matching` chooses among them later and scores those it keeps)
    — word-like samples (``source = "sample"``) or instructed answers (``"instruct"``, kept in ``public_dir``
    when given, so cells that differ only in their release share them)."""
    prompt = release.prompt
    target = release.targets[label].to(torch.float64)
    label_token = prompt.label_token_ids[label]
    if config.source == "instruct":
        ids = instructed_batch(model, tokenizer, prompt, label, config, seed, public_dir)
    else:
        proj = projector()
        sample = proj.sample(config.batch, config.length, torch.Generator().manual_seed(seed))
        if config.optimizer == "admm":
            objective = make_objective(model, prompt, label_token, target.to(proj.embedding.dtype), rows=release.rows)
            sample = run_admm(
                objective,
                proj,
                proj.embed(sample),
                rho=config.rho,
                lr=config.lr,
                outer_steps=config.outer_steps,
                inner_steps=config.inner_steps,
                on_step=on_step,
            ).ids
        ids = sample.tolist()
    if config.optimizer == "select":  # scored with the selection's own factors, kept candidates only
        return unscored(tokenizer, ids, label)
    with torch.no_grad():
        hidden = last_hidden_from_ids(model, [[*prompt.prefix_ids, *i, *prompt.suffix_ids] for i in ids])
        losses = per_example_matching_loss(
            hidden.to(torch.float64), head_logits(model, hidden).to(torch.float64), label_token, target, release.rows
        )
    return [
        Candidate(ids=tuple(i), text=tokenizer.decode(i).strip(), label=label, match_loss=float(loss))
        for i, loss in zip(ids, losses.tolist(), strict=True)
    ]


def load_batch(path: Path) -> list[Candidate]:
    """The candidates of one finished batch file (written by :func:`synthesize`)."""
    return [
        Candidate(ids=tuple(c["ids"]), text=c["text"], label=c["label"], match_loss=c["match_loss"])
        for c in json.loads(path.read_text())
    ]


def synthesize(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    release: Release,
    *,
    per_class: int,
    config: GradmmConfig,
    batch_dir: str | Path,
    public_dir: Path | None = None,
    progress: Progress = SILENT,
) -> list[Candidate]:
    """Generate, filter and return ``per_class`` examples per class (fewer if filtering runs short).

    Finished batches are stored in ``batch_dir`` (one JSON file each, written atomically) and reused,
    so an interrupted call continues where it stopped. Under ``torch.distributed`` the batches are
    split across ranks (``batch_dir`` must be shared) and every rank returns the same selection.
    ``progress`` shows the batches (:data:`BATCHES`, this process's, counted as each is done or found done), the
    ADMM steps of the batch being optimized (``optimizer = "admm"``; :data:`ADMM_STEPS`, set back at each batch)
    and the public label filter (:func:`public_labels`): public counts, fixed by the settings and the
    candidates. ``public_dir``: where instructed public
    candidates are kept for reuse by other runs (public text only; see :func:`generate_batch`).
    Generate–select chooses by gradient matching (``selection = "match"``) or draws among the candidates the
    release's one-step head agrees with (``"filter"``,
    :func:`~privlm.synthesis.gradmm.release_filter.filter_select`; the step it chose goes to
    ``batch_dir/filter-step.json``).

    Args:
        model, tokenizer: the public LM the release was drawn with (checked by fingerprint).
        release: the DP last-layer gradient release (post-processing from here on).
        per_class: examples per class (≥ 1).
        config: ADMM, projection, generation and filtering settings (:class:`GradmmConfig`).
        batch_dir: where finished batches are kept (resumable).

    Returns:
        The selected :class:`Candidate` texts, ``per_class`` per class or fewer.

    Raises:
        UserError: ``per_class < 1`` or a release drawn with another model.
    """
    if per_class < 1:
        raise UserError(f"--per-class must be >= 1 (got {per_class})")
    if release.model_fingerprint != head_fingerprint(model):
        raise UserError("the DP release was drawn with a different model (LM-head weights differ)")
    batch_dir = Path(batch_dir)
    batch_dir.mkdir(parents=True, exist_ok=True)
    n_classes = len(release.prompt.label_token_ids)
    jobs = candidate_jobs(per_class, config, n_classes)
    distributed = dist.is_available() and dist.is_initialized()
    mine = jobs[dist.get_rank() :: dist.get_world_size()] if distributed else jobs
    projectors: dict[int | None, Projector] = {}
    path = {(k, j): batch_dir / f"class{k}_batch{j}.json" for k, j in jobs}
    batches = progress.task(BATCHES + (" (noise-only control)" if release.noise_only else ""), total=len(mine))
    optimized = config.optimizer == "admm" and not all(path[job].exists() for job in mine)
    steps = progress.task(ADMM_STEPS, total=config.outer_steps * config.inner_steps) if optimized else None

    def on_step(outer: int, inner: int, loss: float) -> None:
        assert steps is not None
        steps.update(
            completed=outer * config.inner_steps + inner + 1, description=f"{ADMM_STEPS} (match loss {loss:.4f})"
        )

    def projector_for(label: int) -> Projector:
        key = label if config.class_context else None
        if key not in projectors:
            context = projection_context(tokenizer, release.prompt, key)
            projectors[key] = Projector(model, tokenizer, context, config.top_k)
        return projectors[key]

    for k, j in mine:
        if not path[k, j].exists():
            if steps is not None:
                steps.update(completed=0, description=ADMM_STEPS)
            cands = generate_batch(
                model,
                tokenizer,
                release,
                lambda k=k: projector_for(k),
                k,
                config,
                batch_seed(config.candidate_seed, k, j),
                on_step,
                public_dir,
            )
            write_text_atomic(
                path[k, j], json.dumps([c.__dict__ | {"ids": list(c.ids)} for c in cands], sort_keys=True)
            )
        batches.advance()
    for task in (batches, steps):
        if task is not None:
            task.done()
    if distributed:
        dist.barrier()
    candidates = [c for job in jobs for c in load_batch(path[job])]
    shared = public_dir if config.source == "instruct" else None  # public candidates: caches shared by runs
    if config.label_filter:
        predicted = public_labels(model, tokenizer, release.prompt, candidates, shared, progress)
    else:
        predicted = [c.label for c in candidates]  # ablation: keep every candidate, rank by matching loss only
    if config.optimizer == "select" and config.selection == "filter":
        chosen, step = filter_select(model, release, candidates, predicted, per_class, config.seed, shared, progress)
        write_text_atomic(batch_dir / FILTER_STEP, json.dumps({"step": step}))  # public: the release's post-processing
        return chosen
    if config.optimizer == "select":
        return select_matching(model, release, candidates, predicted, per_class, config.contrastive, shared, progress)
    return select(candidates, predicted, per_class, n_classes)
