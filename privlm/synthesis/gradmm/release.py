"""The one DP release of GRADMM: per class, the noisy sum of clipped last-layer gradients in a public subspace.

For a private example with final hidden state ``h`` (d) and next-token probabilities ``p`` (V) at the
last position, and label token ``y``, the gradient of the cross-entropy with respect to the LM-head
weight is rank one, ``g = (p − e_y) hᵀ`` (V × d). The release keeps the rows ``R`` of ``g`` named by a
public choice (:func:`released_rows`): ``label-rows`` — the K label-token rows (K × d coordinates,
≈ 95 % of the energy; the default) — or ``full`` — all V rows (the paper's). The restricted gradient
``g_R = (p − e_y)_R hᵀ`` has norm ``‖(p − e_y)_R‖·‖h‖``; it is clipped to ``C`` *without forming it*,
and per class ``c``::

    S_c = Σ_{i ∈ c} min(1, C/‖g_{i,R}‖) g_{i,R} + N(0, σ² C² I_{|R|·d}),      σ = release_noise_multiplier(ε, δ, snapped).

Guarantee: under add/remove-one adjacency an example changes exactly one class's sum by at most ``C``
in L2 (it is clipped in the released coordinates themselves), so the whole release (all classes
together) is one Gaussian mechanism with sensitivity ``C`` and is (ε, δ)-DP (classes compose in
parallel). σ is calibrated with the accountant that reads the ledger (PLD), the snapping slack of the
release's coordinates counted, so the accounted ε never exceeds the requested ε (releases drawn before
this calibration used the analytic-Gaussian σ and account ε plus their snapping slack: ≈ 7·10⁻⁵ for
SmolLM2's label rows, ≈ 0.0066 for its full head). The rows ``R`` depend on the public verbalizer only, never on the data. Assumptions: labels are part of the record (replace-one
adjacency would need sensitivity √2·C, i.e. twice the ε budget); the noise comes from a fresh
256-bit OS key through :class:`privlm.randomness.SecureRandom` (ChaCha20, float64 Box–Muller from 53-bit
uniforms; its floating-point assumption is stated there); no private count is released (cosine matching is scale-free). ``dp=False`` skips clipping and noise
and the release says so.

The private pass over the data is separated from the release: :func:`private_factors` computes each
example's last hidden state ``h`` once (``p`` is recomputed from ``h`` and the public head), and
:func:`factor_class_sums` turns them into clipped sums in seconds, so several (ε, seed) releases of one
data set cost one pass. The factors are private data (same protection as the texts).

Under ``torch.distributed`` each rank computes the factors of its shard of the examples, the clipped
sums are all-reduced, and the noise is drawn once on rank 0 and broadcast.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.atomic import atomic_path
from privlm.errors import UserError
from privlm.privacy.calibration import calibrate_gaussian_releases
from privlm.privacy.snapping import CLAMP_BITS, MAX_CLAMP_BITS, snap, snapped_coordinates
from privlm.privacy.validation import check_delta, check_epsilon
from privlm.randomness import SecureRandom
from privlm.resources.padding import shape_buckets
from privlm.synthesis.gradmm.config import RELEASES
from privlm.synthesis.gradmm.prompt import Prompt, encode_text, head_logits, head_weight, last_hidden_from_ids


@dataclass(frozen=True)
class Release:
    """Per-class targets ``S`` (K × |R| × d, float32 or wider) in the released rows ``rows`` of the LM-head
    gradient (``None``: all V rows) and how they were made (all of it public after release)."""

    targets: torch.Tensor
    prompt: Prompt
    dp: bool
    epsilon: float | None
    delta: float | None
    noise_multiplier: float | None
    clip: float | None
    max_tokens: int
    model_fingerprint: str
    meta: dict = field(default_factory=dict)
    rows: tuple[int, ...] | None = None

    @property
    def noise_only(self) -> bool:
        """True for the noise-only control: a release of pure noise that read no data (:func:`noise_release`)."""
        return bool(self.meta.get("noise_only", False))

    @property
    def snapped(self) -> int:
        """The ``snapped`` count of this release's event (:func:`release_snapped`); counted for releases made
        before snapping existed too (over-reports their ε by that slack, never under)."""
        return snapped_coordinates(self.targets.numel(), clamp_bits(self.rows))

    @property
    def released_dim(self) -> int:
        """Coordinates per class target, ``|R|·d`` (public)."""
        return self.targets[0].numel()

    def metadata(self) -> dict:
        """Everything but the tensor, JSON-able (``rows`` only when not all rows: older releases keep their hash)."""
        extra = {} if self.rows is None else {"rows": list(self.rows)}
        return {
            **extra,
            "prompt": self.prompt.to_dict(),
            "dp": self.dp,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip,
            "max_tokens": self.max_tokens,
            "model_fingerprint": self.model_fingerprint,
            "meta": self.meta,
        }

    def noise_norm(self) -> float | None:
        """Expected L2 norm of the noise in one class target, ``σ·C·√(|R|·d)`` (public); ``None`` without DP.

        A class's clipped sum of n examples has norm at most ``n·C``, so the signal can outweigh the noise
        only when ``n ≳ σ·√(|R|·d)`` examples per class; with fewer, the target is mostly noise and the
        generated text depends on it little. Measured: SmolLM2-135M, ε = 1 (σ = 3.73), full release
        (V·d = 28.3M), 50 examples per class: noise norm 19,800, ``cos(DP target, no-DP target)`` ≈ 0.002;
        label rows (K·d = 1,152): noise norm ≈ 127.
        """
        if not self.dp:
            return None
        return float(self.noise_multiplier * self.clip * self.released_dim**0.5)

    def sha256(self) -> str:
        """Hash of the released tensor and its metadata (identifies the release in outputs and ledgers)."""
        digest = hashlib.sha256(json.dumps(self.metadata(), sort_keys=True).encode())
        digest.update(self.targets.detach().contiguous().cpu().numpy().tobytes())
        return digest.hexdigest()

    def save(self, path: str | Path) -> None:
        """Write atomically (temp file + ``os.replace``): a reader never sees half a release."""
        with atomic_path(path) as tmp:
            torch.save({"targets": self.targets.contiguous(), "metadata": self.metadata()}, tmp)

    @classmethod
    def load(cls, path: str | Path) -> Release:
        """Read a release written by :meth:`save`."""
        try:
            blob = torch.load(path, weights_only=True)
        except (OSError, RuntimeError) as err:
            raise UserError(f"cannot read DP release {path}: {err}") from err
        meta = blob["metadata"]
        return cls(
            targets=blob["targets"],
            prompt=Prompt.from_dict(meta["prompt"]),
            dp=meta["dp"],
            epsilon=meta["epsilon"],
            delta=meta["delta"],
            noise_multiplier=meta["noise_multiplier"],
            clip=meta["clip"],
            max_tokens=meta["max_tokens"],
            model_fingerprint=meta["model_fingerprint"],
            meta=meta["meta"],
            rows=None if meta.get("rows") is None else tuple(meta["rows"]),
        )


def head_fingerprint(model: PreTrainedModel) -> str:
    """SHA-256 of the LM-head weight: a release is only meaningful for the model that made it. The head alone
    (cheap: one matrix), unlike :func:`privlm.training.fingerprint.model_fingerprint` (every parameter); run files
    store it under the key ``model_fingerprint``, the name files already written carry."""
    weight = head_weight(model).detach().to(torch.float32).contiguous().cpu()
    return hashlib.sha256(weight.numpy().tobytes()).hexdigest()


def released_rows(prompt: Prompt, release: str) -> tuple[int, ...] | None:
    """The LM-head rows a release of kind ``release`` keeps: the label tokens (``label-rows``) or all (``full``: None).

    Public: depends on the verbalizer only. Unknown kinds are a :class:`UserError` naming the choices."""
    if release not in RELEASES:
        raise UserError(f"--release {release!r} is not one of {', '.join(RELEASES)}")
    return tuple(prompt.label_token_ids) if release == "label-rows" else None


@dataclass(frozen=True)
class PrivateFactors:
    """Per-example last hidden states ``hidden`` (N × d) and class indices ``labels`` (N) of private examples.

    PRIVATE: as sensitive as the texts they come from (cache them only where the data may be kept).
    Under ``torch.distributed`` a rank's factors are those of its own shard of the examples."""

    hidden: torch.Tensor
    labels: torch.Tensor

    def save(self, path: str | Path) -> None:
        """Write atomically (a reader never sees half a cache)."""
        with atomic_path(path) as tmp:
            torch.save({"hidden": self.hidden.contiguous(), "labels": self.labels.contiguous()}, tmp)

    @classmethod
    def load(cls, path: str | Path) -> PrivateFactors:
        """Read factors written by :meth:`save`."""
        blob = torch.load(path, weights_only=True)
        return cls(hidden=blob["hidden"], labels=blob["labels"])


@torch.no_grad()
def private_factors(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, int]],
    prompt: Prompt,
    *,
    max_tokens: int,
    batch_size: int = 16,
    on_batch: Callable[[int], None] | None = None,
) -> PrivateFactors:
    """The one pass over the private ``examples`` (``(text, class_index)``): last hidden state of each.

    Under ``torch.distributed`` this rank takes ``examples[rank::world]``. Order: by width bucket. Every
    batch has ``batch_size`` rows and a public width chosen by each example's own length
    (:func:`~privlm.resources.padding.shape_buckets`), so an example's factor does not depend on which
    others share its batch; the class sums do not depend on the order."""
    n_classes = len(prompt.label_token_ids)
    if dist.is_available() and dist.is_initialized():
        examples = list(examples)[dist.get_rank() :: dist.get_world_size()]
    for _, k in examples:
        if not 0 <= k < n_classes:
            raise UserError(f"label {k} out of range for {n_classes} classes")
    encoded = [(encode_text(tokenizer, prompt, text, max_tokens), k) for text, k in examples]
    max_width = len(prompt.prefix_ids) + max_tokens + len(prompt.suffix_ids)
    hidden = [torch.zeros(0, head_weight(model).shape[1], dtype=head_weight(model).dtype)]
    labels: list[int] = []
    for indices, width in shape_buckets([len(ids) for ids, _ in encoded], batch_size, max_width):
        hidden.append(last_hidden_from_ids(model, [encoded[i][0] for i in indices], width=width, rows=batch_size))
        labels.extend(encoded[i][1] for i in indices)
        if on_batch is not None:
            on_batch(len(indices))
    return PrivateFactors(torch.cat(hidden), torch.tensor(labels, dtype=torch.long))


@torch.no_grad()
def factor_class_sums(
    model: PreTrainedModel,
    factors: PrivateFactors,
    prompt: Prompt,
    *,
    clip: float | None,
    rows: Sequence[int] | None = None,
    batch_size: int = 256,
) -> torch.Tensor:
    """Σ_{i∈c} min(1, C/‖g_{i,R}‖) g_{i,R} per class (K × |R| × d), never forming a per-sample gradient.

    ``rows=None``: all V rows; ``clip=None`` sums unclipped gradients. ``p`` is recomputed from the
    cached ``h`` by the public head. Under ``torch.distributed`` the sums are all-reduced."""
    weight = head_weight(model)
    n_classes = len(prompt.label_token_ids)
    dtype = torch.promote_types(weight.dtype, torch.float32)
    n_rows = weight.shape[0] if rows is None else len(rows)
    sums = torch.zeros(n_classes, n_rows, weight.shape[1], dtype=dtype)
    label_tokens = torch.tensor(prompt.label_token_ids)
    for start in range(0, len(factors.labels), batch_size):
        hidden = factors.hidden[start : start + batch_size]
        classes = factors.labels[start : start + batch_size]
        probs = torch.softmax(head_logits(model, hidden).to(dtype), dim=-1)
        hidden = hidden.to(dtype)
        resid, norms = per_sample_factors(hidden, probs, label_tokens[classes], rows)
        if clip is not None:  # a non-finite example (NaN hidden state) is left out exactly: 0 · NaN would be NaN
            keep = torch.isfinite(norms)[:, None]
            resid = torch.where(keep, resid * torch.clamp(clip / norms.clamp_min(1e-30), max=1.0)[:, None], 0)
            hidden = torch.where(keep, hidden, 0)
        for k in classes.unique().tolist():
            members = classes == k
            sums[k] += resid[members].T @ hidden[members]
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    return sums


def per_sample_factors(
    hidden: torch.Tensor, probs: torch.Tensor, labels: torch.Tensor, rows: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals ``r = p − e_y`` in the released ``rows`` (B × |R|; all V rows when None) and the norms
    ``‖r_R‖·‖h‖`` (B) of the per-sample gradients in those rows."""
    resid = probs.clone()
    resid[torch.arange(len(labels)), labels] -= 1.0
    if rows is not None:
        resid = resid[:, list(rows)]
    return resid, resid.norm(dim=1) * hidden.norm(dim=1)


def clipped_class_sums(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, int]],
    prompt: Prompt,
    *,
    clip: float | None,
    max_tokens: int,
    rows: Sequence[int] | None = None,
    batch_size: int = 16,
) -> torch.Tensor:
    """:func:`factor_class_sums` of :func:`private_factors` of ``examples`` (K × |R| × d)."""
    factors = private_factors(model, tokenizer, examples, prompt, max_tokens=max_tokens, batch_size=batch_size)
    return factor_class_sums(model, factors, prompt, clip=clip, rows=rows)


def clamp_bits(rows: Sequence[int] | None) -> int:
    """The snapping clamp of a release in ``rows`` (public): ``B ≈ 2¹⁶·σC`` for a row subset, ``2⁸·σC`` for all rows.

    A class sum of n clipped examples reaches n·C in a coordinate; at ``2⁸·σC`` (≈ 280 at ε = 4) the
    whole Rotten Tomatoes train split (≈ 4,200 per class) was cut to cosine 0.76 with its own sum.
    ``2¹⁶`` cuts nothing below ≈ 2¹⁵·σ examples per class, at 256× the snapping slack per coordinate
    (:func:`privlm.privacy.snapping.snapped_coordinates`): 2dη ≈ 7·10⁻⁵ for K = 2 label rows of
    SmolLM2, against 1.7 (ε!) for the full head, which therefore keeps the default clamp."""
    return MAX_CLAMP_BITS if rows is not None else CLAMP_BITS


def release_snapped(model: PreTrainedModel, prompt: Prompt, rows: Sequence[int] | None) -> int:
    """The ``snapped`` count of the release's event: K·|R|·d coordinates, weighted by :func:`clamp_bits`
    (known before the draw, for the write-ahead ledger; equals :attr:`Release.snapped` after it)."""
    weight = head_weight(model)
    coordinates = len(prompt.label_token_ids) * (weight.shape[0] if rows is None else len(rows)) * weight.shape[1]
    return snapped_coordinates(coordinates, clamp_bits(rows))


def release_noise_multiplier(epsilon: float, delta: float, snapped: int) -> float:
    """σ of one release: the smallest (within 0.1 %) for which the ledger's accountant (PLD) gives
    ε ≤ ``epsilon`` at ``delta`` for one Gaussian release with ``snapped`` weighted coordinates
    (:func:`release_snapped`), the snapping slack included."""
    return calibrate_gaussian_releases(epsilon, delta, 1, snapped)


def add_gaussian_noise(sums: torch.Tensor, std: float, clamp: int = CLAMP_BITS) -> torch.Tensor:
    """``sums + N(0, std²)`` per coordinate, drawn once (rank 0, then broadcast under torch.distributed).

    Every call draws a fresh key from the OS (:meth:`SecureRandom.from_os`) and forgets it: the noise is
    reproducible from nothing, no user seed included. The float64 sum is snapped with clamp bits ``clamp``
    (:func:`privlm.privacy.snapping.snap`): the release's event must say
    ``snapped = snapped_coordinates(sums.numel(), clamp)`` (:func:`release_snapped`)."""
    distributed = dist.is_available() and dist.is_initialized()
    noisy = sums.clone()
    if not distributed or dist.get_rank() == 0:
        exact = sums.double() + SecureRandom.from_os().normal(sums.shape, (0,), std=std, dtype=torch.float64)
        noisy.copy_(snap(exact, std, clamp))  # exact in float32: multiples of Λ below 2²⁴·Λ
    if distributed:
        dist.broadcast(noisy, src=0)
    return noisy


def draw_release(
    model: PreTrainedModel,
    prompt: Prompt,
    factors: PrivateFactors | None,
    *,
    epsilon: float | None,
    delta: float | None,
    clip: float = 1.0,
    dp: bool = True,
    rows: Sequence[int] | None = None,
    max_tokens: int = 64,
    save_to: str | Path | None = None,
    meta: dict | None = None,
    noise_multiplier: float | None = None,
) -> Release:
    """Draw the (ε, δ)-DP per-class release in rows ``rows`` from the private ``factors`` (module docstring).

    ``noise_multiplier``: the σ a caller already calibrated for (ε, δ) and wrote ahead to its ledger (one
    value, so the ledger and the draw cannot differ); ``None`` calibrates it here (:func:`release_noise_multiplier`).

    ``factors=None`` is the noise-only control: the same σ and C, clipped sums of zero, so the release is
    pure noise and reads no data at all (``meta["noise_only"]``; needs ``dp``). ``max_tokens`` is recorded
    only (the factors were computed with it). If ``save_to`` is given the release is written there
    (atomically, rank 0 only) before this function returns, so a crash afterwards never draws it again.
    """
    if dp:
        if epsilon is None or delta is None:
            raise UserError(f"a DP release needs epsilon and delta (got {epsilon}, {delta})")
        check_epsilon(epsilon)
        check_delta(delta)
        if not clip > 0:
            raise UserError(f"clip must be > 0 (got {clip})")
        sigma = (
            noise_multiplier
            if noise_multiplier is not None
            else release_noise_multiplier(epsilon, delta, release_snapped(model, prompt, rows))
        )
    elif factors is None:
        raise UserError("the noise-only control needs epsilon and delta (it is noise at their σ)")
    if factors is None:
        weight = head_weight(model)
        shape = (len(prompt.label_token_ids), weight.shape[0] if rows is None else len(rows), weight.shape[1])
        sums = torch.zeros(shape, dtype=torch.promote_types(weight.dtype, torch.float32))
    else:
        sums = factor_class_sums(model, factors, prompt, clip=clip if dp else None, rows=rows)
    targets = add_gaussian_noise(sums, sigma * clip, clamp_bits(rows)) if dp else sums
    if not dp and bool((targets.flatten(1).norm(dim=1) == 0).any()):
        raise UserError("a class has no private examples; every class needs at least one for --no-dp")
    release = Release(
        targets=targets,
        prompt=prompt,
        dp=dp,
        epsilon=float(epsilon) if dp else None,
        delta=float(delta) if dp else None,
        noise_multiplier=float(sigma) if dp else None,
        clip=float(clip) if dp else None,
        max_tokens=max_tokens,
        model_fingerprint=head_fingerprint(model),
        meta={**(meta or {}), **({"noise_only": True} if factors is None else {})},
        rows=None if rows is None else tuple(rows),
    )
    if save_to is not None and (not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0):
        release.save(save_to)
    return release
