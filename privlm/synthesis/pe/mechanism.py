"""Private Evolution for text (Aug-PE; Xie et al., ICML 2024): DP synthetic text without training.

Per class, a population of M public candidates (zero-shot samples of the public LM,
:func:`privlm.synthesis.generation.baselines.zero_shot`) evolves for T iterations. In iteration t every private
example votes once, for its nearest candidate of its own class (mean-pooled final hidden states of the
public model, unit-normalized, Euclidean nearest neighbour computed per row, :func:`nearest_candidates`), and the vote histogram of
all classes together is released with Gaussian noise. The ⌈M/(1+V)⌉ candidates with the most noisy votes
survive and the public LM writes V rewrites ("variations") of each; after the last iteration the top
n per class by the last noisy histogram are the output.

**Guarantee.** Under add/remove-one adjacency an example casts exactly one vote per iteration, and every
other example's vote is computed from its own embedding and the public candidates alone, so one
iteration's histogram (all classes concatenated, K·M bins) changes by one in one bin: L2 sensitivity 1.
Adding N(0, σ²) to every bin is a Gaussian mechanism with noise multiplier σ, and the T iterations
compose adaptively as T ``GaussianRelease(σ)`` events; σ is the smallest (within 1e-3) for which
privlm's PLD accountant gives ε ≤ target at δ (:func:`privlm.privacy.calibration.calibrate_gaussian_releases`),
and the ledger reports what was drawn. Noise: a fresh 256-bit OS key per histogram
(:class:`privlm.randomness.SecureRandom`), float64, snapped (:mod:`privlm.privacy.snapping`, clamp 2¹⁶σ so
no realistic vote count is cut) with the slack counted in every event. Assumptions: labels are part of
the record; M, K, T, the instructions and the public model are public; nothing about the private data
but the noisy histograms is released.

**The wall.** Private data enters through ``load_private`` alone, which only :class:`PrivateVoter`
calls (and only when a histogram must be drawn): it turns the texts into embeddings (kept in memory, or
in ``embedding_cache``, which is as private as the data) and answers each iteration with the noisy
histogram. Generation, candidate embeddings, selection and variations see noisy histograms and public
inputs only.

**Files** next to ``FILE.jsonl``, in ``FILE.jsonl.pe/``: ``privacy.json`` — the write-ahead ledger (an
entry is durable before each draw; a draw that died before its histogram was saved is redrawn and
counted again: an over-count, never an under-count); ``run.json`` — the public settings a resume must
repeat (checked key by key); ``.lock`` — held (``flock``) by the process running it;
``population{t}.json`` — iteration t's public candidates; ``population0-pieces/`` — the zero-shot
pieces of population 0 sampled so far (:func:`~privlm.synthesis.generation.baselines.sample_pieces`: a run
killed while it is made resumes at its first missing piece; removed once population 0 is saved);
``rewrites{t}-{k}.jsonl`` — class k's rewrites of iteration t finished so far
(:class:`privlm.journal.Journal`: a killed iteration resumes after them; removed once the population is
saved); ``histogram{t}.json`` — iteration t's noisy histogram, saved the moment it is drawn and reused by a
resume, never redrawn. A resume starts at the latest saved population (the earlier ones may be gone);
:meth:`PEPaths.public_files` names what another machine needs to resume (kept public by
:mod:`privlm.experiments.kept_runs`). ``FILE.jsonl`` and ``FILE.privacy.json`` are written atomically at
the end.

**Progress** (on a :class:`~privlm.progress.Progress`): the histograms (T), the zero-shot candidates (M per
class), each iteration's rewrites (K·⌈M/(1+V)⌉·V) — public counts, fixed by the settings — and the private
pass as a task without a count (``private=True``: its size would be N).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.atomic import atomic_path, json_once, write_text_atomic
from privlm.errors import UserError
from privlm.lm.features import hidden_features
from privlm.lm.generation import chat_prompt, sample_many
from privlm.privacy.calibration import calibrate_gaussian_releases
from privlm.privacy.events import GaussianRelease
from privlm.privacy.ledger import Ledger, LedgerEntry
from privlm.privacy.snapping import MAX_CLAMP_BITS, snap, snapped_coordinates
from privlm.privacy.validation import check_delta, check_epsilon
from privlm.progress import SILENT, Progress, Task
from privlm.randomness import SecureRandom
from privlm.runfolder import (
    RunFolder,
    check_or_write_settings,
    epsilon_statement,
    hold,
    write_ahead,
)
from privlm.synthesis.generation.baselines import zero_shot
from privlm.synthesis.gradmm.release import head_fingerprint
from privlm.synthesis.pe.config import PEConfig


def histogram_snapped(n_classes: int, candidates: int) -> int:
    """The ``snapped`` count of one histogram's event: K·M bins at clamp 2¹⁶σ."""
    return snapped_coordinates(n_classes * candidates, MAX_CLAMP_BITS)


def noise_multiplier(epsilon: float, delta: float, config: PEConfig, n_classes: int, per_class: int) -> float:
    """σ for T histograms of K·M bins: the smallest whose composition is (ε, δ)-DP (PLD, snapping slack counted)."""
    snapped = histogram_snapped(n_classes, config.candidates(per_class))
    return calibrate_gaussian_releases(epsilon, delta, config.iterations, snapped)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero)."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)


def nearest_candidates(queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Index (Q,) of each query's nearest candidate (queries (Q, d), candidates (M, d)).

    Distance: squared Euclidean up to each query's constant ‖q‖², i.e. ‖c‖² − 2⟨c, q⟩, in float64.
    **Tie rule**: the lowest candidate index among the smallest computed values. **Per-row shape**: each
    query is computed on its own, as one (M, d) × (d,) product against the whole candidate matrix, so
    its result is a function of that query and the (public) candidates alone: the same floating-point
    operations whatever other private rows are present, how many there are, or where the query sits.
    A batched search (scikit-learn's chunks of rows) rounds a query's distances differently with its
    chunk, and a query on an exact tie could then switch its vote when another example is added."""
    cand = np.ascontiguousarray(candidates, dtype=np.float64)
    offsets = np.einsum("ij,ij->i", cand, cand)
    nearest = np.empty(len(queries), dtype=np.int64)
    for i, query in enumerate(np.asarray(queries, dtype=np.float64)):
        nearest[i] = int(np.argmin(offsets - 2.0 * (cand @ query)))
    return nearest


def vote_counts(private: np.ndarray, labels: np.ndarray, candidates: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Exact votes (PRIVATE): per class k, how many class-k private embeddings have each class-k candidate
    as their nearest (:func:`nearest_candidates`: per-row computation, ties to the lower index). One vote
    per example, and no example's vote depends on the others: L2 sensitivity 1."""
    counts = []
    for k, cand in enumerate(candidates):
        members = private[labels == k]
        votes = np.zeros(len(cand), dtype=np.int64)
        if len(members):
            votes = np.bincount(nearest_candidates(members, cand), minlength=len(cand))
        counts.append(votes)
    return counts


def noisy_histograms(counts: Sequence[np.ndarray], sigma: float) -> list[np.ndarray]:
    """``counts`` (all classes together) + N(0, σ²) per bin, float64, snapped at clamp 2¹⁶σ; a fresh OS key."""
    flat = torch.tensor(np.concatenate(counts), dtype=torch.float64)
    noise = SecureRandom.from_os().normal(flat.shape, (0,), std=sigma, dtype=torch.float64)
    noisy = snap(flat + noise, sigma, MAX_CLAMP_BITS).numpy()
    return np.split(noisy, np.cumsum([len(c) for c in counts])[:-1])


def noise_only_histograms(sizes: Sequence[int], sigma: float, seed: int, t: int) -> list[np.ndarray]:
    """The noise-only control's histogram ``t``: N(0, σ²) per bin for classes of ``sizes`` candidates, from a
    generator seeded by ``seed`` and ``t`` (public: it hides nothing, and a rerun draws the same). Not drawn
    through :func:`noisy_histograms`, whose key is a fresh OS key and whose snapping grid depends on σ: this
    draw is exactly σ times one standard-normal stream, so its ranking — all that PE's selection reads — and
    with it every text kept is the same at every σ (only the rows' ``noisy_votes`` scale), and the control run
    at one ε stands for every ε."""
    rng = np.random.default_rng([seed, t, NOISE_ONLY_STREAM])
    return [rng.normal(0.0, sigma, size) for size in sizes]


NOISE_ONLY_STREAM = 0x5E0  # keeps the control's seeded stream apart from any other use of the cell's seed
PRIVATE_PASS = "PE: embedding the private examples"  # a private task: no count


class CandidateEmbedder:
    """Unit-row embeddings of each iteration's candidates, one ``(M, d)`` array per class, reusing the rows of
    the texts in the previous call's population (an iteration's survivors: a quarter of the population at
    V = 3; each row is kept as its own copy, so no earlier iteration's array stays in memory).
    ``embed`` must give each text a row that is a function of that text alone (``fixed_shape`` batches,
    :mod:`privlm.resources.padding`), so a reused row is bitwise the one a fresh pass gives and the votes are
    unchanged. Public: candidates only."""

    def __init__(self, embed: Callable[[Sequence[str]], np.ndarray]) -> None:
        self._embed = embed
        self._rows: dict[str, np.ndarray] = {}

    def __call__(self, population: Sequence[Sequence[str]]) -> list[np.ndarray]:
        fresh = list(dict.fromkeys(t for texts in population for t in texts if t not in self._rows))
        embedded = {t: row.copy() for t, row in zip(fresh, self._embed(fresh))} if fresh else {}
        rows = {**self._rows, **embedded}
        self._rows = {t: rows[t] for texts in population for t in texts}
        return [unit_rows(np.stack([rows[t] for t in texts])) for texts in population]


class PrivateVoter:
    """The private side of the wall: embeds the private examples (once, on first use; shown on ``progress``
    as :data:`PRIVATE_PASS`, a private task) and answers :meth:`histograms` with the votes plus noise
    (``sigma=None``: exact votes, NOT private)."""

    def __init__(
        self,
        embed: Callable[[Sequence[str]], np.ndarray],
        load_private: Callable[[], Sequence[tuple[str, int]]],
        n_classes: int,
        cache: Path | None = None,
        progress: Progress = SILENT,
    ) -> None:
        self._embed, self._load, self._n_classes, self._cache = embed, load_private, n_classes, cache
        self._progress = progress
        self._private: tuple[np.ndarray, np.ndarray] | None = None

    def _embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        if self._private is None:
            if self._cache is not None and self._cache.exists():
                blob = np.load(self._cache)
                self._private = blob["embeddings"], blob["labels"]
            else:
                reading = self._progress.task(PRIVATE_PASS, private=True)
                examples = list(self._load())
                labels = np.array([k for _, k in examples], dtype=np.int64)
                if len(labels) and not (0 <= labels.min() and labels.max() < self._n_classes):
                    raise UserError(f"a private label is out of range for {self._n_classes} classes")
                self._private = unit_rows(self._embed([t for t, _ in examples])), labels
                reading.done()
                if self._cache is not None:
                    self._cache.parent.mkdir(parents=True, exist_ok=True)
                    with atomic_path(self._cache) as tmp, open(tmp, "wb") as handle:
                        np.savez(handle, embeddings=self._private[0], labels=self._private[1])
        return self._private

    def histograms(
        self,
        candidates: Sequence[np.ndarray],
        sigma: float | None,
        before_noise: Callable[[], None] | None = None,
    ) -> list[np.ndarray]:
        """Noisy votes per class over ``candidates`` (unit-row embeddings per class); ``before_noise`` runs after
        the votes are counted and right before the noise is drawn (the write-ahead; not called without noise)."""
        counts = vote_counts(*self._embeddings(), candidates)
        if sigma is None:
            return [c.astype(np.float64) for c in counts]
        if before_noise is not None:
            before_noise()
        return noisy_histograms(counts, sigma)


@dataclass(frozen=True)
class PEPaths(RunFolder):
    """Where a run keeps its files (module docstring)."""

    SUFFIX = ".pe"

    def population(self, t: int) -> Path:
        return self.workdir / f"population{t}.json"

    def pieces(self) -> Path:
        """The folder of population 0's zero-shot pieces sampled so far (public LM, public instructions)."""
        return self.workdir / "population0-pieces"

    def histogram(self, t: int) -> Path:
        return self.workdir / f"histogram{t}.json"

    def rewrites(self, t: int, label: int) -> Path:
        return self.workdir / f"rewrites{t}-{label}.jsonl"

    def latest_population(self) -> int:
        """The last iteration whose population is saved (0 when none is: iteration 0's is made first)."""
        saved = (re.fullmatch(r"population(0|[1-9][0-9]*)\.json", p.name) for p in self.workdir.glob("population*"))
        return max((int(m.group(1)) for m in saved if m), default=0)

    def saved_histograms(self) -> list[int]:
        """The iterations whose noisy histogram is saved, in order."""
        saved = (re.fullmatch(r"histogram(0|[1-9][0-9]*)\.json", p.name) for p in self.workdir.glob("histogram*"))
        return sorted(int(m.group(1)) for m in saved if m)

    def public_files(self) -> list[Path]:
        """``run.json``, every noisy histogram, the latest population and the rewrites journaled after it: the
        settings, the releases themselves and their public post-processing (the rewrites are the public LM's, of
        candidates chosen by the noisy votes). With the ledger, enough to resume where the run is. None for a run
        without noise (its histograms are exact private counts) or whose settings cannot be read. The noise-only
        control's are public whole (:meth:`releases_nothing`)."""
        if self.saved_settings().get("noise_multiplier") is None:
            return []
        t = self.latest_population()
        files = [self.manifest, *map(self.histogram, self.saved_histograms()), self.population(t)]
        files += sorted(self.workdir.glob(f"rewrites{t + 1}-*.jsonl"))
        return [f for f in files if f.is_file()]

    def releases_nothing(self) -> bool:
        """A noise-only control's folder (its ``run.json`` says ``noise_only``): it reads no private data and
        writes no ledger (:func:`run_pe`), its histograms seeded noise."""
        return self.saved_settings().get("noise_only") is True


@dataclass(frozen=True)
class PEResult:
    """The output rows, the privacy statement written beside them, and how many histograms were reused."""

    rows: list[dict[str, Any]]
    privacy: dict[str, Any]
    reused_histograms: int


def _digest(population: Sequence[Sequence[str]]) -> str:
    return hashlib.sha256(json.dumps(population).encode()).hexdigest()


def _write_json(path: Path, value: Any) -> None:
    write_text_atomic(path, json.dumps(value, sort_keys=True) + "\n")


def _start(paths: PEPaths, settings: dict[str, Any], resume: bool) -> None:
    """Create the run folder, or check a resumed one repeats the saved settings."""
    if paths.manifest.exists() and not resume:
        raise UserError(
            f"{paths.workdir} holds a PE run for {paths.out}; pass --resume to reuse its noisy histograms "
            f"(drawing them again would spend the privacy budget twice) or remove {paths.workdir}"
        )
    check_or_write_settings(paths.manifest, settings, indent=None)  # the layout of _write_json


def histogram_label(t: int) -> str:
    """The label of histogram t's ledger entry."""
    return f"PE histogram {t}"


def histogram_entry(sigma: float, snapped: int, t: int) -> LedgerEntry:
    """Histogram t's ledger entry: one Gaussian release of noise multiplier σ, ``snapped`` coordinates."""
    return LedgerEntry(GaussianRelease(sigma, snapped=snapped), 1, histogram_label(t))


def rewrite_prompt(tokenizer: PreTrainedTokenizerBase, config: PEConfig, label_name: str, text: str) -> str:
    """The public LM's prompt to rewrite ``text`` of class ``label_name`` (the variation instruction, chat-wrapped)."""
    return chat_prompt(tokenizer, config.variation_instruction.format(label_name=label_name, text=text))


REWRITE_MARGIN = 8  # tokens: a generated text re-encoded inside the instruction may differ from its count by a few


def check_rewrite_context(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, label_names: Sequence[str], config: PEConfig
) -> None:
    """Refuse, before any private example is read or histogram drawn, settings whose rewrite prompts may not fit
    the model's context: the variation instruction around a text of up to ``max_new_tokens`` tokens (what the
    LM wrote), plus ``max_new_tokens`` new tokens and :data:`REWRITE_MARGIN`. Public: settings and model only.

    A check, not a bound: natural text re-encodes to about the tokens it was written in, but a model that writes
    token soup (a randomly initialised test model) can re-encode longer, and then a rewrite is still refused
    mid-run, after histograms were drawn (:func:`~privlm.lm.generation.sample_many`)."""
    context = model.config.max_position_embeddings
    longest = max(
        len(
            tokenizer(rewrite_prompt(tokenizer, config, name, ""), add_special_tokens=not tokenizer.chat_template)[
                "input_ids"
            ]
        )
        for name in label_names
    )
    need = longest + 2 * config.max_new_tokens + REWRITE_MARGIN
    if need > context:
        raise UserError(
            f"PE's rewrite prompts need up to {need} tokens ({longest} of instruction, a text of up to "
            f"{config.max_new_tokens}, {config.max_new_tokens} new, {REWRITE_MARGIN} of margin) but the model's "
            f"context is {context}: lower max_new_tokens (--max-new-tokens) or shorten the variation instruction"
        )


def rewrite_seed(seed: int, label: int, t: int) -> int:
    """The public sampling seed of class ``label``'s rewrites in iteration ``t`` (1-based) of a run seeded ``seed``."""
    return seed * 1_000_003 + label * 10_007 + t - 1


def next_population(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    population: Sequence[str],
    histogram: np.ndarray,
    label_name: str,
    config: PEConfig,
    seed: int,
    task: Task | None = None,
    journal: Path | None = None,
) -> list[str]:
    """Public post-processing of one class's noisy histogram: the top ⌈M/(1+V)⌉ candidates by noisy
    votes (ties to the lower index), followed by V rewrites of each by the public LM, M in all (``task``:
    advanced by each rewrite; ``journal``: where finished rewrites are kept for a resume,
    :func:`privlm.lm.generation.sample_many`)."""
    keep = np.argsort(-histogram, kind="stable")[: config.survivors(len(population))]
    survivors = [population[i] for i in keep]
    prompts = [rewrite_prompt(tokenizer, config, label_name, text) for text in survivors]
    rewrites = sample_many(
        model, tokenizer, prompts, config.variations, seed, config.sampling, task=task, journal=journal
    )
    return (survivors + [text for group in rewrites for text in group])[: len(population)]


def run_pe(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    label_names: Sequence[str],
    load_private: Callable[[], Sequence[tuple[str, int]]],
    *,
    out: str | Path,
    per_class: int,
    config: PEConfig,
    epsilon: float | None,
    delta: float | None,
    resume: bool = False,
    noise_only: bool = False,
    settings: dict[str, Any] | None = None,
    embedding_cache: Path | None = None,
    progress: Progress = SILENT,
) -> PEResult:
    """Run (or resume) PE and write ``out`` and its ``.privacy.json`` sidecar (module docstring).

    ``epsilon=None`` runs without noise: NOT private (exact votes; a reference and a test mode).
    ``noise_only``: the run's noise-only control: every histogram is pure noise at the σ of the DP run at
    ``epsilon`` (no vote counted, no private example read: ``load_private`` is never called), drawn from a
    generator seeded by the config's seed and the iteration (:func:`noise_only_histograms`), so survivors and
    output are a seeded random choice; it spends no privacy (sidecar ε = 0, no ledger). What PE's rewrites
    and selection do without the private votes.
    ``embedding_cache``: a file for the private embeddings (PRIVATE; keyed by the caller to one data set,
    model, pooling and ``max_tokens``). ``settings``: the caller's public settings (the data spec string,
    ``private_per_class``, ...), saved in ``run.json`` with the run's own (ε, δ, σ, config, labels and the
    fingerprint of the model's LM head, :func:`~privlm.synthesis.gradmm.release.head_fingerprint`) and checked
    on resume. Neither the content of the private data nor the model below its head is bound: a resume with
    another data set under the same spec is not detected (a plain hash of it in the published folder would let
    anyone test a guessed data set), nor one with a model changed below an unchanged head (e.g. a merged LoRA
    on the attention layers); either mixes two runs' texts, never spends ε unaccounted. The run folder is locked (``flock``) for the whole run: a second process
    gets a :class:`UserError`.

    Args:
        model, tokenizer: the public LM that writes and varies candidates (and embeds them).
        label_names: the public class names, in class-id order.
        load_private: returns the private ``(text, label)`` rows; called only when votes are needed.
        out: the JSONL file to write (its folder must exist); the run folder sits beside it.
        per_class: synthetic examples per class (≥ 1).
        config: population sizes, iterations and sampling (:class:`PEConfig`).
        epsilon, delta: the target; ``epsilon=None`` runs without noise (not private).
        resume: continue the run folder's last finished iteration, after the rewrites it journaled (settings
            must match).
        settings, embedding_cache: see above.
        progress: where the run shows its stages (module docstring, "Progress").

    Returns:
        :class:`PEResult`: the selected texts and the privacy statement written to the sidecar.

    Raises:
        UserError: a bad size or (ε, δ), settings that differ from the run folder's on resume, a run
            folder locked by another process, an output folder that does not exist, or rewrite prompts that may
            not fit the model's context (:func:`check_rewrite_context`)."""
    if per_class < 1:
        raise UserError(f"--per-class must be >= 1 (got {per_class})")
    dp = epsilon is not None
    if noise_only and not dp:
        raise UserError("PE's noise-only control needs an epsilon: its noise is that of the DP run at that epsilon")
    if dp:
        if delta is None:
            raise UserError("PE with an epsilon needs delta as well")
        check_epsilon(epsilon)
        check_delta(delta)
    paths = PEPaths(Path(out))
    if not paths.out.parent.is_dir():
        raise UserError(f"output folder {paths.out.parent} does not exist")
    if config.iterations > 1:
        check_rewrite_context(model, tokenizer, label_names, config)
    sigma = noise_multiplier(epsilon, delta, config, len(label_names), per_class) if dp else None
    settings = {
        **(settings or {}),
        "config": config.to_dict(),
        "per_class": per_class,
        "epsilon": epsilon,
        "delta": delta if dp else None,
        "label_names": list(label_names),
        "noise_multiplier": sigma,
        "model_fingerprint": head_fingerprint(model),
        **({"noise_only": True} if noise_only else {}),
    }
    n_classes, m = len(label_names), config.candidates(per_class)
    snapped = histogram_snapped(n_classes, m)

    def embed(
        texts: Sequence[str],
    ) -> np.ndarray:  # each text's batch shape depends on its own length only: privlm.resources.padding
        return hidden_features(model, tokenizer, texts, config.pooling, max_length=config.max_tokens, fixed_shape=True)

    with hold(paths.workdir):
        _start(paths, settings, resume)
        booked = {entry.label for entry in Ledger.load(paths.ledger)} if paths.ledger.exists() else set()
        unbooked = [t for t in paths.saved_histograms() if histogram_label(t) not in booked]
        if dp and not noise_only and unbooked:  # each was booked before it was drawn (write-ahead)
            raise UserError(
                f"{paths.workdir} holds noisy histograms its ledger does not book ({', '.join(map(str, unbooked))}): "
                f"their draws would go uncounted; remove {paths.workdir}"
            )

        voter = PrivateVoter(embed, load_private, n_classes, embedding_cache, progress)
        drawn_so_far = progress.task("PE: noisy histograms", total=config.iterations)

        def first_population() -> list[list[str]]:
            rows = zero_shot(
                model,
                tokenizer,
                label_names,
                m,
                config.seed,
                instructions=config.instructions,
                sampling=config.sampling,
                keep=paths.pieces(),
                progress=progress,
            )
            return [[r["text"] for r in rows if r["label"] == k] for k in range(n_classes)]

        def variations(t: int, previous: list[list[str]], histograms: list[np.ndarray]) -> list[list[str]]:
            written = progress.task(
                f"PE: rewrites {t}/{config.iterations - 1}",
                total=n_classes * config.survivors(m) * config.variations,
                transient=True,
            )
            population = [
                next_population(
                    model,
                    tokenizer,
                    previous[k],
                    histograms[k],
                    label_names[k],
                    config,
                    rewrite_seed(config.seed, k, t),
                    written,
                    paths.rewrites(t, k),
                )
                for k in range(n_classes)
            ]
            written.done()
            return population

        embed_candidates = CandidateEmbedder(embed)

        def noisy(t: int, population: list[list[str]]) -> dict[str, Any]:
            if noise_only:
                drawn = noise_only_histograms([len(texts) for texts in population], sigma, config.seed, t)
            else:
                # write-ahead: histogram t is booked durably right before its noise is drawn (after the private
                # embedding pass and the vote count, so a kill during those books nothing)
                drawn = voter.histograms(
                    embed_candidates(population),
                    sigma,
                    lambda: write_ahead(paths.ledger, histogram_entry(sigma, snapped, t)),
                )
            return {"population_sha256": _digest(population), "histograms": [h.tolist() for h in drawn]}

        # a resume starts at the latest saved population: the earlier ones are not needed (their histograms are
        # saved, and the population after each was made from it) and may be gone (kept_runs keeps the latest only)
        start = min(paths.latest_population(), config.iterations - 1)
        reused, histograms = 0, []
        population = json_once(paths.population(start), first_population)  # made only when start is 0
        shutil.rmtree(paths.pieces(), ignore_errors=True)
        for t in range(config.iterations):
            if t < start:
                if not paths.histogram(t).exists():
                    raise UserError(
                        f"{paths.population(start)} is saved but {paths.histogram(t)} is not; remove {paths.workdir}"
                    )
                reused += 1
                drawn_so_far.advance()
                continue
            if t > start:
                population = json_once(paths.population(t), partial(variations, t, population, histograms))
                for k in range(n_classes):
                    paths.rewrites(t, k).unlink(missing_ok=True)
            reused += paths.histogram(t).exists()
            saved = json_once(paths.histogram(t), partial(noisy, t, population))
            if saved["population_sha256"] != _digest(population):
                raise UserError(f"{paths.histogram(t)} counts another population; remove {paths.workdir}")
            histograms = [np.array(h, dtype=np.float64) for h in saved["histograms"]]
            drawn_so_far.advance()
        drawn_so_far.done()
        rows = []
        for k in range(n_classes):
            for i in np.argsort(-histograms[k], kind="stable")[:per_class]:
                rows.append(
                    {
                        "text": population[k][i],
                        "label": k,
                        "label_name": label_names[k],
                        "noisy_votes": float(histograms[k][i]),
                        "dp": dp,
                        **({"noise_only": True} if noise_only else {}),
                    }
                )
        privacy = privacy_statement(paths, config, sigma, epsilon, delta, n_classes, m, noise_only)
        _write_json(paths.sidecar, privacy)
        write_text_atomic(paths.out, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        return PEResult(rows=rows, privacy=privacy, reused_histograms=reused)


def privacy_statement(
    paths: PEPaths,
    config: PEConfig,
    sigma: float | None,
    epsilon: float | None,
    delta: float | None,
    n_classes: int,
    candidates: int,
    noise_only: bool = False,
) -> dict[str, Any]:
    """The sidecar: ε accounted from the run folder's ledger (every draw, redraws included; never below the
    target), σ, T and the mechanism; ε = 0 for the noise-only control (no data read); or a warning without DP."""
    if sigma is None:
        return {
            "dp": False,
            "epsilon": None,
            "delta": None,
            "warning": "NOT differentially private (no noise): the histograms are exact private vote counts",
        }
    public = {
        "noise_multiplier": sigma,
        "iterations": config.iterations,
        "candidates_per_class": candidates,
        "bins_per_histogram": n_classes * candidates,
    }
    if noise_only:
        return {
            "dp": True,
            "noise_only": True,
            "epsilon": 0.0,
            "delta": 0.0,
            "epsilon_of_the_noise": epsilon,
            **public,
            "mechanism": "noise-only control: every histogram is pure seeded Gaussian noise at the σ of the DP run "
            "at epsilon_of_the_noise; no private data was read, so it spends no privacy",
        }
    return {
        **epsilon_statement(Ledger.load(paths.ledger), epsilon, delta, ledger_file=paths.ledger, sidecar=paths.sidecar),
        **public,
        "mechanism": "Private Evolution: per iteration, every private example votes once for its nearest "
        "candidate of its class (L2 sensitivity 1, add/remove-one); the histogram gets N(0, σ²) per bin; "
        "T Gaussian releases composed with PLD; selection and variations are post-processing",
    }
