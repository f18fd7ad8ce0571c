"""End-to-end GRADMM run with resume: draw (or reload) the DP release, generate, filter, write.

On disk, next to the output ``FILE.jsonl``:

- ``FILE.jsonl.gradmm/privacy.json`` — the write-ahead ledger of the release (one Gaussian release at
  the σ calibrated for (ε, δ)), saved durably (fsync'd, atomic) *before* the release is drawn, so no
  release tensor, batch or text derived from it is ever on disk without a ledger that accounts for it.
  A draw that dies before ``release.pt`` is written has left nothing outside the process; the redraw
  under ``resume`` is covered by the same entry (not recorded twice);
- ``FILE.jsonl.gradmm/release.pt`` — the DP release, saved the moment it is drawn and reused by
  ``resume=True`` (drawing it again would spend the privacy budget twice, so without ``resume`` an
  existing release is an error, never silently replaced). A resume reuses it without reading the
  private data: nothing new about the data (whatever it is now) is computed, so it needs no data binding;
- ``FILE.jsonl.gradmm/run.json`` — the public settings, which a resumed run must repeat exactly;
- ``FILE.jsonl.gradmm/batches/`` — finished ADMM batches (atomic files);
- ``FILE.jsonl`` and ``FILE.privacy.json`` — written through temp files and ``os.replace`` only
  at the end, so they are never half-written.

Private data enters through the ``load_private`` callable alone, which is called only when a release
has to be drawn (and not at all for the noise-only control, ``config.noise_only``); the generation and
filtering that follow see the release only. ``factor_cache`` (optional) is a file where the private
examples' last-layer factors are kept between runs on the same data (an experiment's cells): it holds
private data and must live where the data may be kept, never in published results.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.atomic import write_text_atomic
from privlm.errors import UserError
from privlm.privacy.events import GaussianRelease
from privlm.privacy.ledger import Ledger, LedgerEntry
from privlm.progress import SILENT, Progress
from privlm.runfolder import (
    RunFolder,
    check_or_write_settings,
    epsilon_statement,
    hold,
    write_ahead,
)
from privlm.synthesis.gradmm.config import GradmmConfig
from privlm.synthesis.gradmm.filtering import Candidate
from privlm.synthesis.gradmm.generate import instructions_for, synthesize
from privlm.synthesis.gradmm.prompt import Prompt
from privlm.synthesis.gradmm.release import (
    PrivateFactors,
    Release,
    draw_release,
    private_factors,
    release_noise_multiplier,
    release_snapped,
    released_rows,
)

PRIVATE_PASS = "reading the private examples (hidden states at the prompt)"  # load_factors' private task: no count


@dataclass(frozen=True)
class GradmmPaths(RunFolder):
    """Where a run keeps its files (see module docstring)."""

    SUFFIX = ".gradmm"

    @property
    def release(self) -> Path:
        return self.workdir / "release.pt"

    @property
    def batches(self) -> Path:
        return self.workdir / "batches"


@dataclass(frozen=True)
class GradmmResult:
    """The selected examples, the release they came from, and the privacy statement written to disk."""

    rows: list[dict]
    release: Release
    privacy: dict
    reused_release: bool


def privacy_statement(release: Release, paths: GradmmPaths) -> dict:
    """The sidecar's content: what the whole output costs in privacy, and how it was made.

    ``epsilon_accounted`` is the PLD answer at ``delta`` for the run folder's write-ahead ledger
    (``paths.ledger``), which holds every draw made for this output, a redraw after a lost or deleted release
    included (without one, e.g. on a rank without the shared folder: this release alone); the reported ``epsilon`` is the larger of that and the calibration
    target, so it is never under-reported (:func:`privlm.runfolder.reported_epsilon`).
    """
    if not release.dp:
        return {
            "dp": False,
            "epsilon": None,
            "delta": None,
            "warning": "NOT differentially private (--no-dp): no clipping, no noise; the output may reveal the private data",
            "release_sha256": release.sha256(),
        }
    noise_norm = release.noise_norm()
    public = {
        "released_rows": "all" if release.rows is None else list(release.rows),
        "released_dim_per_class": release.released_dim,
        "noise_multiplier": release.noise_multiplier,
        "noise_std": release.noise_multiplier * release.clip,
        "clip": release.clip,
        "noise_norm_per_class": noise_norm,
        # n·C ≤ noise norm below this many examples per class: the target is then mostly noise (Release.noise_norm)
        "examples_per_class_to_match_noise": noise_norm / release.clip,
        "release_sha256": release.sha256(),
    }
    if release.noise_only:
        return {
            "dp": True,
            "noise_only": True,
            "epsilon": 0.0,
            "delta": 0.0,
            **public,
            "mechanism": "noise-only control: pure Gaussian noise at the σ and C of the DP release; "
            "no private data was read, so it spends no privacy",
        }
    ledger = Ledger.load(paths.ledger) if paths.ledger.exists() else Ledger()
    if not len(ledger):
        ledger = Ledger(
            [LedgerEntry(GaussianRelease(release.noise_multiplier, snapped=release.snapped), 1, "this release")]
        )
    return {
        **epsilon_statement(ledger, release.epsilon, release.delta, ledger_file=paths.ledger, sidecar=paths.sidecar),
        **public,
        **private_set(release),
        "clipping": "per-sample L2 clipping of the last-position LM-head gradient in the released rows "
        "(closed form, rank one)",
        "mechanism": "Gaussian, one release per class (disjoint classes, parallel composition), "
        "add/remove-one adjacency, sensitivity C; generation and filtering are post-processing",
    }


def private_set(release: Release) -> dict:
    """What the guarantee protects, as recorded with the release: the data it read (``private_data``, the
    user's own description of it). Never its size N: unlike DP-SGD (q = B/N), the release does not need N,
    and an exact N would tell an attacker who knows every other row whether the target is in the set."""
    settings = release.meta.get("settings", {})
    return {"private_data": settings["data"]} if "data" in settings else {}


def _rows(selected: Sequence[Candidate], release: Release) -> list[dict]:
    names = release.prompt.label_names
    return [
        {
            "text": c.text,
            "label": c.label,
            "label_name": names[c.label],
            "match_loss": c.match_loss,
            "dp": release.dp,
            **({"noise_only": True} if release.noise_only else {}),
        }
        for c in selected
    ]


def _with_default_config(saved: dict) -> dict:
    """Saved settings with the config completed: a run saved before a setting existed used its default."""
    if isinstance(saved.get("config"), dict):
        saved["config"] = {**GradmmConfig().to_dict(), **saved["config"]}
    return saved


def obtain_release(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    load_private: Callable[[], Sequence[tuple[str, int]]],
    *,
    paths: GradmmPaths,
    settings: dict,
    config: GradmmConfig,
    dp: bool,
    epsilon: float | None,
    delta: float | None,
    resume: bool,
    factor_cache: Path | None = None,
    progress: Progress = SILENT,
) -> tuple[Release, bool]:
    """The run's release and whether it was reused: reloaded under ``resume``, else drawn and saved."""
    reuse = paths.release.exists()
    if reuse and not resume:
        raise UserError(
            f"{paths.release} already holds a DP release for {paths.out}; pass --resume to reuse it "
            f"(drawing again would spend the privacy budget twice) or remove {paths.workdir}"
        )
    # a new draw rewrites run.json (a folder without a release has spent nothing it binds); no final newline, as ever
    check_or_write_settings(paths.manifest, settings, check=reuse, upgrade=_with_default_config, newline=False)
    if reuse:
        release = Release.load(paths.release)
        if (
            release.dp and not release.noise_only
        ):  # a release saved by an older privlm had no ledger: account for it now
            _write_ahead(paths, release.noise_multiplier, release.snapped, unless_recorded=True)
        return release, True
    rows = released_rows(prompt, config.release)
    snapped = release_snapped(model, prompt, rows)
    sigma = (
        release_noise_multiplier(epsilon, delta, snapped) if dp and epsilon is not None and delta is not None else None
    )
    if dp and not config.noise_only:  # write-ahead: the ledger is durable before the release is written
        _write_ahead(paths, sigma, snapped)
    factors = (
        None
        if config.noise_only
        else load_factors(model, tokenizer, prompt, load_private, config.max_private_tokens, factor_cache, progress)
    )
    release = draw_release(
        model,
        prompt,
        factors,
        epsilon=epsilon,
        delta=delta,
        clip=config.clip,
        dp=dp,
        rows=rows,
        max_tokens=config.max_private_tokens,
        save_to=paths.release,
        noise_multiplier=sigma,  # the ledger's σ
        meta={"settings": settings},  # never N (private_set)
    )
    return release, False


def load_factors(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    load_private: Callable[[], Sequence[tuple[str, int]]],
    max_tokens: int,
    cache: Path | None,
    progress: Progress = SILENT,
) -> PrivateFactors:
    """The private examples' factors: read from ``cache`` when it exists, else computed (and saved there);
    the computation is shown on ``progress`` as :data:`PRIVATE_PASS`, a private task (no count: it would be N).

    Assumption: ``cache`` names one (data, model, prompt, ``max_tokens``) combination; the caller keys it.
    Refused under ``torch.distributed`` with several ranks: each rank's factors are its shard only, and one
    shard reloaded on every rank would count some examples several times (sensitivity above C)."""
    if cache is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise UserError("a private factor cache holds one rank's shard; run without a cache under torch.distributed")
    if cache is not None and cache.exists():
        return PrivateFactors.load(cache)
    reading = progress.task(PRIVATE_PASS, private=True)
    factors = private_factors(model, tokenizer, load_private(), prompt, max_tokens=max_tokens, on_batch=reading.advance)
    reading.done()
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        factors.save(cache)
    return factors


def _write_ahead(paths: GradmmPaths, sigma: float | None, snapped: int, unless_recorded: bool = False) -> None:
    """Append the release at noise multiplier ``sigma`` with ``snapped`` coordinates to ``paths.ledger``
    (rank 0 writes; fsync'd, atomic) before it is drawn.

    Every draw appends its own entry: a draw that died before its release was saved is then counted too
    (an over-count, which is safe), and a release that was saved, published and deleted can never be
    redrawn uncounted. ``unless_recorded`` (a saved release reused on resume) appends only when no entry
    for the event exists yet (a release from a privlm without a ledger). ``sigma=None`` (missing ε or δ)
    writes nothing and lets :func:`draw_release` refuse the arguments."""
    if sigma is None or (dist.is_available() and dist.is_initialized() and dist.get_rank() != 0):
        return
    entry = LedgerEntry(
        GaussianRelease(sigma, snapped=snapped), 1, "GRADMM release"
    )  # the ledger sits beside its output
    write_ahead(paths.ledger, entry, unless_recorded=unless_recorded)


def run_gradmm(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    load_private: Callable[[], Sequence[tuple[str, int]]],
    *,
    out: str | Path,
    per_class: int,
    config: GradmmConfig,
    dp: bool,
    epsilon: float | None,
    delta: float | None,
    resume: bool = False,
    settings: dict | None = None,
    factor_cache: Path | None = None,
    public_dir: Path | None = None,
    progress: Progress = SILENT,
) -> GradmmResult:
    """Release (or reuse), generate, filter and write ``out`` plus its ``.privacy.json`` sidecar (with
    ``source = "instruct"``, it also names the public ``instructions`` the candidates answered, one per class).
    ``public_dir``: a folder for public candidates shared with other runs (:func:`synthesize`).

    Args:
        model, tokenizer: the public LM whose last-layer gradient is released and matched.
        prompt: the public prompt and label words of the task.
        load_private: returns the private ``(text, label)`` rows; called only when a release is drawn.
        out: the JSONL file to write (its folder must exist); the run folder sits beside it.
        per_class: synthetic examples per class.
        config: release, ADMM, generation and filtering settings (:class:`GradmmConfig`).
        dp, epsilon, delta: ``dp=False`` is the non-private reference (no noise: NOT private);
            otherwise the release is calibrated to (ε, δ).
        resume: reuse the run folder's release and finished batches (its settings must match).
        settings: the caller's public settings bound to the run folder.
        factor_cache: a file for the private per-example factors (PRIVATE; keyed by the caller).
        progress: where the run shows its stages: the private pass when a release is drawn (:func:`load_factors`:
            a private task, no count), the batches, ADMM steps and label filter (:func:`synthesize`: public counts).

    Returns:
        :class:`GradmmResult`: the selected texts and the privacy statement written to the sidecar.

    Raises:
        UserError: a missing output folder, instructions that cannot be resolved, a bad (ε, δ), or a run
            folder whose settings or model differ."""
    paths = GradmmPaths(Path(out))
    if paths.out.parent and not paths.out.parent.is_dir():
        raise UserError(f"output folder {paths.out.parent} does not exist")
    # public; resolved (one per class, else refused) before any release is drawn
    instructions = instructions_for(prompt, config) if config.source == "instruct" else None
    settings = {
        **(settings or {}),
        "config": config.to_dict(),
        "per_class": per_class,
        "dp": dp,
        "epsilon": epsilon,
        "delta": delta,
        "prompt": prompt.to_dict(),
    }
    rank0 = not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0
    with hold(paths.workdir) if rank0 else contextlib.nullcontext():  # one process draws and books at a time
        release, reused = obtain_release(
            model,
            tokenizer,
            prompt,
            load_private,
            paths=paths,
            settings=settings,
            config=config,
            dp=dp,
            epsilon=epsilon,
            delta=delta,
            resume=resume,
            factor_cache=factor_cache,
            progress=progress,
        )
    selected = synthesize(
        model,
        tokenizer,
        release,
        per_class=per_class,
        config=config,
        batch_dir=paths.batches,
        progress=progress,
        public_dir=public_dir,
    )
    rows = _rows(selected, release)
    privacy = privacy_statement(release, paths)
    if instructions is not None:
        privacy = {**privacy, "instructions": instructions}
    if rank0:
        write_text_atomic(paths.sidecar, json.dumps(privacy, indent=2, sort_keys=True) + "\n")
        write_text_atomic(paths.out, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return GradmmResult(rows=rows, release=release, privacy=privacy, reused_release=reused)
