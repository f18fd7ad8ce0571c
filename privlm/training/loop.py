"""The private training loop: Poisson-sampled logical steps, atomic checkpoints, exact resume,
a clean stop when the privacy budget is spent, on one process or several (:mod:`.distributed`).

    run = prepare(model, rows, collate, TrainConfig(epsilon=3.0, delta=1e-5, batch_size=16, epochs=2))
    result = train_loop(run, run_dir=Path("runs/x"), resume=False)

Each logical step: this rank's part of a Poisson sample (rate q = B/N), clipped per sample by the
DP-SGD engine (:mod:`privlm.dpsgd.engine`), clipped sums all-reduced over ranks, noise once, AdamW.
σ is calibrated from the target ε for the planned number of steps ⌈epochs·⌈1/q⌉⌉ with the norm mode's
accountant (randomized clipping for ``hutchinson``/``hutchpp``). When σ is given instead, the loop
stops before the first step that would take ε past the target.

The training loss shown in the progress bar and written to ``metrics.jsonl`` (``dp_loss``) of a
private run is the DP loss released by the same Gaussian mechanism as the gradient and accounted with
it (:mod:`privlm.dpsgd.loss_release`; per-sample losses clamped to [0, ``loss_bound``]); each logged
value is the mean of the released losses of the steps since the previous log line (post-processing).
With ``loss_noise_fraction=0`` no loss is released, shown or written, and the accounting is plain
DP-SGD. A non-private run (``private=False``) logs its plain mean loss (``loss``): nothing of it is private.
The release is the final weights, the logged DP losses and ``privacy.json``.

**Write-ahead ledger.** With a run folder, nothing that depends on a step — a ``metrics.jsonl`` line,
the loss passed to ``on_progress``, a checkpoint, the final weights — is written before the run's
``privacy.json`` covers that step: at each log or checkpoint step the steps not yet covered are
recorded and the ledger is saved (fsync'd temporary file, ``os.replace``) *first*. A run killed at any
point has therefore released nothing outside its ledger; the ledger may run ahead of the last checkpoint.

**Resume and replays.** A resume restarts from the last checkpoint and re-runs the steps after it with
the checkpoint's saved randomness (same Poisson batch, probes, noise). Those replays are not recorded
again: the ledger already holds every step up to the last one covered (it is read back, and only steps
beyond it are recorded). They release nothing new because every input of a replayed step is the same as
in the interrupted run — the weights and optimizer state (from the checkpoint), the randomness (from
the checkpoint), the settings and world size (checked), and the training rows and the model (checked by
their fingerprints, :mod:`privlm.training.fingerprint`; a resume with other data or another model is
refused) — so a replayed value is the value already released and accounted, recomputed (up to the
floating-point non-determinism of the kernels, which no DP argument here covers). Without the data
fingerprint a replay on other rows of the same size would release a second value with the same noise.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from privlm.atomic import write_text_atomic
from privlm.dpsgd.clipping import LossFn
from privlm.dpsgd.engine import PrivacyEngine, PrivateModel
from privlm.dpsgd.losses import causal_lm_losses
from privlm.dpsgd.sampling import MicroBatches, PoissonBatchSampler, physical_batches, take_rows
from privlm.dpsgd.settings import DPSGDSettings
from privlm.errors import UserError
from privlm.privacy import Ledger, PoissonGaussianStep, dpsgd_epsilon
from privlm.privacy.ledger import new_run_id
from privlm.randomness import RunStreams
from privlm.training import checkpoint as ckpt
from privlm.training import fsdp
from privlm.training.distributed import (
    DistContext,
    all_reduce_clipped_sums,
    all_reduce_grads,
    barrier,
    broadcast_parameters,
    check_same_on_all_ranks,
    context,
    gather_objects,
    shard_of,
    shared_streams,
)
from privlm.training.fingerprint import fingerprints as run_fingerprints

PRECISIONS = ("float32", "bf16")
RESUME_INSENSITIVE = ("checkpoint_every", "log_every", "max_new_tokens", "physical_batch_size")  # memory only


@dataclass(frozen=True, kw_only=True)
class TrainConfig(DPSGDSettings):
    """Settings of one training run: the DP-SGD settings (:class:`~privlm.dpsgd.settings.DPSGDSettings`:
    ε or σ, δ, clip, norm mode, randomness, DP loss) plus the task, model and schedule.

    ``private=False`` trains without clipping or noise (a non-private baseline; nothing is accounted).
    ``batch_size`` is the *expected* logical batch size B (q = B/N); ``physical_batch_size`` caps the
    micro-batches (memory only: a resume may change it). ``head_only`` (classify): train only the label-word rows of the output layer
    (:mod:`privlm.training.head`); ``train_layers`` N: train only the last N decoder blocks (their LoRA
    adapters with ``lora`` R > 0, else their full weights; embeddings, lower blocks, final norm and output
    layer frozen, :mod:`privlm.training.top_blocks`); ``cache``: the dtype the frozen features (head-only)
    or the hidden states entering block L−N (``train_layers``) are cached in once per example
    (:mod:`privlm.training.prefix_cache`), None to recompute them every step. ``task="generate"``:
    prompt → completion rows phrased by ``template`` (``{text}`` where the prompt goes; None: the default,
    :data:`privlm.training.data.GENERATE_TEMPLATE`), scored after training by greedy decoding of at most
    ``max_new_tokens`` tokens per test prompt. Messages name each field as ``privlm train`` spells it
    (``--epsilon``, ``--clip``, ...)."""

    task: str = "classify"
    private: bool = True
    max_length: int = 128
    batch_size: int = 16
    epochs: float = 1.0
    lr: float = 1e-3
    lora: int = 0
    lora_layers: int | None = None
    train_layers: int | None = None
    head_only: bool = False
    cache: str | None = "bfloat16"
    checkpoint_every: int = 50
    log_every: int = 10
    template: str | None = None
    max_new_tokens: int = 32
    precision: str = "float32"
    fsdp: bool = False

    OPTION_NAMES: ClassVar[dict[str, str]] = {
        "epsilon": "--epsilon",
        "noise_multiplier": "--noise-multiplier",
        "delta": "--delta",
        "max_grad_norm": "--clip",
        "norm_mode": "--norm-mode",
        "probes": "--probes",
        "accountant": "--accountant",
        "physical_batch_size": "--physical-batch-size",
        "loss_noise_fraction": "--loss-noise-fraction",
    }

    @property
    def is_private(self) -> bool:
        return self.private

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("batch_size", "checkpoint_every", "log_every", "max_length"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.lora_layers is not None and (self.lora < 1 or self.lora_layers < 1):
            raise UserError(
                f"--lora-layers needs --lora R > 0 and N >= 1 (got --lora {self.lora}, --lora-layers {self.lora_layers})"
            )
        if self.precision not in PRECISIONS:
            raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.precision == "bf16" and self.private and not self.bookkeeping:
            # refused before any work; PerSampleClipper.clipped_backward refuses it too (the Python API)
            raise UserError(
                "--precision bf16 needs book-keeping (the default): the clipped sum of --second-backward would be "
                "computed in bf16, where one example's clipped gradient can exceed C"
            )
        if self.head_only and (
            self.task != "classify" or self.lora or self.lora_layers is not None or self.train_layers is not None
        ):
            raise UserError(
                "--head-only trains the label-word rows of a classify task: it excludes --lora, --train-layers "
                "and --task lm/generate"
            )
        if self.fsdp and (self.head_only or self.train_layers is not None or not self.private or not self.bookkeeping):
            raise UserError(
                "--fsdp shards the whole model for DP-SGD with book-keeping: it excludes --head-only, --train-layers "
                "(cached, one process), --no-dp and --second-backward"
            )
        if self.train_layers is not None:
            if self.train_layers < 1:
                raise UserError(f"--train-layers must be >= 1, got {self.train_layers}")
            if self.lora_layers is not None and self.lora_layers != self.train_layers:
                raise UserError(
                    f"--train-layers {self.train_layers} with --lora R puts the adapters on those blocks; "
                    f"drop --lora-layers {self.lora_layers}"
                )
        if self.task == "generate":
            if not 1 <= self.max_new_tokens < self.max_length:
                raise UserError(
                    f"--max-new-tokens must be in 1..{self.max_length - 1} (below --max-length {self.max_length}: "
                    f"the prompt needs room), got {self.max_new_tokens}"
                )
            if self.template is not None and self.template.count("{text}") > 1:
                raise UserError(f"--template must contain {{text}} at most once, got {self.template!r}")
        elif self.template is not None:
            raise UserError(
                "--template phrases the prompts of --task generate here; a classify prompt comes with its labels "
                "(--labels NAMES --template TEXT)"
            )
        if not (self.epochs > 0 and self.lr > 0 and self.max_grad_norm > 0 and self.lora >= 0):
            raise UserError(
                f"need --epochs > 0, --lr > 0, --clip > 0 and --lora >= 0 "
                f"(got {self.epochs}, {self.lr}, {self.max_grad_norm}, {self.lora})"
            )

    def resume_key(self) -> dict[str, Any]:
        """The settings a resumed run must share with the interrupted one."""
        return {k: v for k, v in asdict(self).items() if k not in RESUME_INSENSITIVE}


@dataclass
class Run:
    """A prepared run: the model, the (DP) optimizer and what one step needs."""

    config: TrainConfig
    module: nn.Module
    optimizer: Any
    engine: PrivacyEngine | None
    private_model: PrivateModel | None
    rows: Sequence[Any]
    collate: Callable[[list], Any]
    loss_fn: LossFn
    sample_rate: float
    total_steps: int
    streams: RunStreams
    ctx: DistContext
    event: PoissonGaussianStep | None
    budget_steps: int

    @property
    def noise_multiplier(self) -> float | None:
        """σ of the noise drawn (None when not private)."""
        return None if self.private_model is None else self.optimizer.noise_multiplier

    @property
    def accounted_noise_multiplier(self) -> float | None:
        """σ the accountant records per step: σ/√(1+α²) with a DP loss release, else σ."""
        return None if self.event is None else self.event.noise_multiplier


@dataclass
class LoopResult:
    """How the loop ended: steps taken in total, why it stopped, ε spent (None when not private)."""

    steps: int
    total_steps: int
    stopped: str
    epsilon: float | None
    resumed_from: int | None
    wall_s: float
    history: list[dict[str, Any]] = field(default_factory=list)


def prepare(
    module: nn.Module,
    rows: Sequence[Any],
    collate: Callable[[list], Any],
    config: TrainConfig,
    ctx: DistContext | None = None,
    loss_fn: LossFn | None = None,
    micro_batches: MicroBatches = physical_batches,
) -> Run:
    """Wrap ``module`` (its trainable parameters are trained) for DP-SGD on ``rows`` (all ranks pass
    the same rows in the same order); ``collate`` turns a list of rows into a model batch;
    ``loss_fn(module, batch)`` gives per-sample losses (B,) — default: the mean token loss;
    ``micro_batches`` cuts a private step's batch into micro-batches (``PrivacyEngine.make_private``)."""
    loss_fn = loss_fn or functools.partial(causal_lm_losses, reduction="mean")
    ctx = ctx or context()
    if len(rows) == 0:
        raise UserError("no training examples")
    streams = shared_streams(config.seed, ctx)
    check_same_on_all_ranks((len(rows), config.resume_key()), "dataset size or settings", ctx)
    broadcast_parameters(module, ctx)
    if config.fsdp:
        fsdp.shard_model(module, ctx)  # after the broadcast: every rank shards rank 0's weights
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise UserError("the model has no trainable parameters")
    optimizer = torch.optim.AdamW(params, lr=config.lr)
    loader = DataLoader(rows, batch_size=config.batch_size, collate_fn=collate)
    engine = private_model = event = None
    if config.private:
        engine = config.privacy_engine(streams)
        private_model, optimizer, private_loader = config.make_private(
            engine, module, optimizer, loader, epochs=config.epochs, loss_fn=loss_fn, micro_batches=micro_batches
        )
        sample_rate = private_loader.batch_sampler.sample_rate
        event = engine.event
    else:
        sample_rate = min(1.0, config.batch_size / len(rows))
    total = math.ceil(config.epochs * math.ceil(1 / sample_rate))
    budget = total
    if event is not None and config.noise_multiplier is not None and config.epsilon is not None:
        budget = steps_within_budget(event, config.epsilon, config.delta, total, config.accountant)
        if budget == 0:
            raise UserError(
                f"noise multiplier {config.noise_multiplier} (accounted {event.noise_multiplier:.4g}) "
                f"cannot take a single step within ε = {config.epsilon}"
            )
    return Run(
        config,
        module,
        optimizer,
        engine,
        private_model,
        rows,
        collate,
        loss_fn,
        sample_rate,
        total,
        streams,
        ctx,
        event,
        budget,
    )


def steps_within_budget(
    event: PoissonGaussianStep, epsilon: float, delta: float, upper: int, method: str = "pld"
) -> int:
    """The largest n ≤ ``upper`` with ε(n repetitions of ``event``) ≤ ``epsilon`` (bisection; ε grows with n)."""

    def eps(n: int) -> float:
        return dpsgd_epsilon(
            event.noise_multiplier,
            event.sample_rate,
            n,
            delta,
            event.clipping,
            event.probes,
            method,
            snapped=event.snapped,
        )

    if eps(upper) <= epsilon:
        return upper
    lo, hi = 0, upper  # eps(lo) <= epsilon < eps(hi), with eps(0) = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps(mid) <= epsilon else (lo, mid)
    return lo


def _step(run: Run, batch: Any, n_local: int) -> float | None:
    """One logical step on this rank's part of the batch. Returns the loss it may log: the released
    DP loss of a private step (None without a loss release), the plain mean loss of a non-private one."""
    run.optimizer.zero_grad()
    if run.private_model is not None:
        with _autocast(run):  # bf16: forward/backward only; norms, clipped sums and noise stay >= float32
            run.private_model.clipped_backward(batch)
        all_reduce_clipped_sums(run.private_model.clipper, run.ctx)
        run.optimizer.step()
        return run.optimizer.released_loss
    params = [p for p in run.module.parameters() if p.requires_grad]
    losses = torch.zeros(0)
    if n_local:
        with _autocast(run):
            losses = run.loss_fn(run.module, batch)
            (losses.sum() / (run.sample_rate * len(run.rows))).backward()
        losses = losses.detach()
    all_reduce_grads(params, run.ctx)
    run.optimizer.step()
    return _mean_loss(losses, run.ctx)


def _autocast(run: Run) -> torch.autocast:
    """bf16 autocast for ``precision = "bf16"`` (the weights and the optimizer stay float32: master
    weights), else a disabled one."""
    device = next(run.module.parameters()).device.type
    return torch.autocast(device, dtype=torch.bfloat16, enabled=run.config.precision == "bf16")


def _mean_loss(losses: torch.Tensor, ctx: DistContext) -> float | None:
    """The plain mean loss over all ranks (non-private runs only); None for an empty step."""
    totals = torch.tensor([float(losses.sum()), float(losses.numel())], dtype=torch.float64)
    if ctx.enabled:
        dist.all_reduce(totals)
    return float(totals[0] / totals[1]) if totals[1] > 0 else None


def _rng_state(run: Run) -> dict[str, Any]:
    """The run's keys (every draw is addressed by step, so the keys are the whole RNG state; the same
    on every rank)."""
    return {"streams": run.streams.state()}


def _optimizer_state(run: Run) -> dict[str, Any]:
    """The optimizer's state to checkpoint (gathered whole under ``--fsdp``: a collective)."""
    if run.config.fsdp:  # always private (TrainConfig): the DP optimizer wraps the torch one
        return fsdp.gathered_optimizer_state(run.optimizer.optimizer)
    return run.optimizer.state_dict()


def _restore(run: Run, state: ckpt.Checkpoint) -> None:
    ckpt.load_trainable_state(run.module, state.weights)
    if run.config.fsdp:
        fsdp.load_optimizer_state(run.optimizer.optimizer, state.optimizer)
    else:
        run.optimizer.load_state_dict(state.optimizer)
    run.streams = RunStreams.from_state(state.rng["streams"])
    if run.private_model is not None:
        run.private_model.clipper.randomness = run.streams.probes
        run.optimizer.randomness = run.streams.noise
        run.optimizer.steps = state.step
        for entry in state.ledger:
            if entry.event != run.event:
                raise UserError(f"{state.path}: ledger event {entry.event} differs from this run's {run.event}")
            run.engine.accountant.record(entry.event, entry.count)
        run.engine.steps = state.step


def _meta(run: Run) -> dict[str, Any]:
    return {
        "config": run.config.resume_key(),
        "sample_rate": run.sample_rate,
        "total_steps": run.total_steps,
        "noise_multiplier": run.noise_multiplier,
        "accounted_noise_multiplier": run.accounted_noise_multiplier,
        "world": run.ctx.world,
    }


def check_run_dir(
    run_dir: Path, config: TrainConfig, resume: bool, world: int = 1, fingerprints: dict[str, str] | None = None
) -> ckpt.Checkpoint | None:
    """The checkpoint to resume from (None: start fresh). Refuses to start over an earlier run without
    ``resume``, and to resume a checkpoint written with other settings or another world size; with
    ``fingerprints`` (``{"data": ..., "model": ...}``, :mod:`privlm.training.fingerprint`) also one written
    for other training rows or another model, or one that has no fingerprints to compare."""
    found = ckpt.checkpoints(run_dir) if run_dir.is_dir() else []
    if not resume:
        if found or (run_dir / "privacy.json").exists():
            raise UserError(
                f"{run_dir} already holds a training run; pass --resume to continue it or choose a new --out"
            )
        return None
    if (run_dir / ckpt.FINISHED).exists():
        raise UserError(f"{run_dir} holds a finished run (its checkpoints were deleted); choose a new --out")
    if not found:
        if (run_dir / "privacy.json").exists():
            raise UserError(f"{run_dir} has a privacy ledger but no checkpoint to resume from; choose a new --out")
        return None
    state = ckpt.load_checkpoint(found[-1])
    saved, now = state.meta.get("config") or {}, _json_roundtrip(config.resume_key())
    differing = [
        f"{key}: {saved.get(key)!r} then, {now.get(key)!r} now"
        for key in sorted(set(saved) | set(now))
        if saved.get(key) != now.get(key)
    ]
    if state.meta.get("world") != world:
        differing.append(f"world size: {state.meta.get('world')} then, {world} now")
    if differing:
        raise UserError(
            f"{found[-1]} was written with other settings ({'; '.join(differing)}); resume with the same options"
        )
    if fingerprints is not None:
        _check_fingerprints(found[-1], state.meta.get("fingerprints"), fingerprints)
    return state


_FINGERPRINTED = {
    "data": "other training data (the fingerprint of the training rows read differs: another --data file or "
    "version, --max-train, --max-length or tokenizer)",
    "model": "another model (the fingerprint of the initial weights and model configuration differs: another "
    "--model, model seed or LoRA initialisation)",
}


def _check_fingerprints(path: Path, saved: Any, now: dict[str, str]) -> None:
    """Refuse a resume whose data or model fingerprint differs from the checkpoint's. The message names which
    one differs, never a fingerprint (the data fingerprint is a function of the private data)."""
    if not isinstance(saved, dict):
        raise UserError(
            f"{path} holds no data and model fingerprints (written by an older privlm), so resuming it "
            "cannot be checked against its training data and model; start a new run (another --out)"
        )
    for key, what in _FINGERPRINTED.items():
        if saved.get(key) != now[key]:
            raise UserError(
                f"{path} was written for {what}; replaying its saved noise on them would reveal "
                "a noise-free difference, so it is not resumed: resume with the same inputs or choose a new --out"
            )


def _json_roundtrip(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _trim_metrics(path: Path, step: int) -> None:
    """Keep the metrics lines of steps ≤ ``step`` (those the ledger covers: lines after it cannot exist
    under the write-ahead order, but a torn last line or an older privlm's may)."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and json.loads(line).get("step", 0) <= step
    ]
    write_text_atomic(path, "".join(line + "\n" for line in kept))


def append_metrics(run_dir: Path | None, record: dict[str, Any]) -> None:
    """Append one JSON line to ``RUN_DIR/metrics.jsonl``."""
    if run_dir is None:
        return
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def train_loop(
    run: Run,
    run_dir: Path | None = None,
    resume: bool = False,
    on_progress: Callable[[int, int, float | None, float | None], None] | None = None,
) -> LoopResult:
    """Train until the planned steps are done or the budget is spent.

    With ``run_dir``: checkpoints every ``checkpoint_every`` steps and at the end, ``privacy.json`` and
    ``metrics.jsonl``; ``resume`` continues from the last checkpoint (same settings required).
    ``on_progress(step, total, loss, epsilon)`` is called after every step; ``loss`` and ε are those of the
    last log line (None before the first): the mean of the losses of the steps it covers (private:
    released DP losses; None when no loss is released), as written to ``metrics.jsonl`` under ``dp_loss``
    (``loss`` when not private, clipping-only σ = 0 included) — shown only once the ledger covers them (module
    docstring).
    A resume is refused when the checkpoint was written for other rows or another model (fingerprints
    of ``run.rows`` and of ``run.module`` as prepared, taken before the checkpoint is loaded)."""
    start_time = time.perf_counter()
    ctx, config = run.ctx, run.config
    ledger = Ledger(private_release=run.streams.private, run=new_run_id())  # a resume reads the run's own back
    start = covered = 0  # covered: the steps privacy.json accounts for (≥ the last checkpoint's step)
    state = prints = None
    if run_dir is not None:
        prints = run_fingerprints(run.module, run.rows, run.collate)  # the initial model: before any restore
        _check_fingerprints_across_ranks(prints, ctx)
        if ctx.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            ckpt.remove_stale_temporaries(run_dir)
        barrier(ctx)
        state = check_run_dir(run_dir, config, resume, ctx.world, prints)
        if state is not None:
            _restore(run, state)
            start = state.step
            ledger, covered = _resumed_ledger(run_dir / "privacy.json", state, run.event)
            if ctx.is_main:
                if run.event is not None:
                    ledger.save(run_dir / "privacy.json")
                _trim_metrics(run_dir / "metrics.jsonl", covered)
        barrier(ctx)
    replayed = covered  # steps the ledger already covers: a resume recomputes them but writes no line again
    end = min(run.total_steps, run.budget_steps)
    epsilon = _epsilon(run) if start else (0.0 if run.event is not None else None)
    history: list[dict[str, Any]] = []
    sampler = iter(PoissonBatchSampler(len(run.rows), run.sample_rate, end - start, run.streams.sampler, start + 1))
    loss_key = "dp_loss" if config.differentially_private else "loss"  # σ = 0 (clipping only) logs a plain "loss"
    window: list[float] = []
    shown: float | None = None  # the last logged loss (what on_progress may show)

    def cover(step: int) -> None:
        """Write ahead: make privacy.json account for every step up to ``step`` (durably, on rank 0)
        before anything computed from those steps is written; steps it already covers (replays after a
        resume) are not recorded again."""
        nonlocal covered
        if run_dir is None or run.event is None or covered >= step:
            return
        ledger.record(run.event, step - covered, f"steps {covered + 1}-{step}")
        covered = step
        if ctx.is_main:
            ledger.save(run_dir / "privacy.json")

    for step in range(start + 1, end + 1):
        indices = shard_of(next(sampler), ctx)
        rows = [run.rows[i] for i in indices]
        batch = run.collate(rows) if rows else _empty_batch(run)
        step_loss = _step(run, batch, len(rows))
        if step_loss is not None:
            window.append(step_loss)
        loss = sum(window) / len(window) if window else None
        log_step = step % config.log_every == 0 or step == end
        checkpoint_step = run_dir is not None and (step % config.checkpoint_every == 0 or step == end)
        if log_step or checkpoint_step:
            cover(step)  # before the metrics line, the checkpoint and (after the loop) the final weights
        if log_step:
            epsilon = _epsilon(run)
            # no timings in a released file: a step's time follows its batch's longest sampled row, which would
            # tell which rows Poisson sampling picked (the amplification rests on hiding that)
            record = {"step": step, "epsilon": epsilon}
            if loss is not None:
                record[loss_key] = loss
            window = []
            shown = loss
            if step > replayed:  # a replayed line is on disk already: never release a second copy of it
                history.append(record)
                if ctx.is_main:
                    append_metrics(run_dir, record)
        if checkpoint_step:
            rng = _rng_state(run)
            weights, optimizer_state = ckpt.trainable_state(run.module), _optimizer_state(run)  # all ranks: gathers
            if ctx.is_main:
                held = ledger.prefix(step) if run.event is not None else ledger
                ckpt.save_checkpoint(
                    run_dir,
                    step,
                    weights,
                    optimizer_state,
                    rng,
                    held,
                    {**_meta(run), "fingerprints": prints},
                )
            barrier(ctx)
        if on_progress is not None:
            on_progress(step, end, shown, epsilon)
    stopped = "budget" if end < run.total_steps else "done"
    return LoopResult(
        end, run.total_steps, stopped, _epsilon(run), start or None, time.perf_counter() - start_time, history
    )


def _epsilon(run: Run) -> float | None:
    return None if run.engine is None else run.engine.epsilon(run.config.delta)


def _check_fingerprints_across_ranks(prints: dict[str, str], ctx: DistContext) -> None:
    """Every rank must train the same rows and the same model (names which differs, never the values)."""
    every = gather_objects(prints, ctx)
    differing = sorted(key for key in prints if any(p[key] != every[0][key] for p in every))
    if differing:
        raise UserError(
            f"the {' and '.join(differing)} fingerprint differs between ranks: every rank must read "
            "the same training rows in the same order and load the same model"
        )


def _resumed_ledger(path: Path, state: ckpt.Checkpoint, event: PoissonGaussianStep | None) -> tuple[Ledger, int]:
    """The run's ledger on resume and how many steps it covers.

    With the write-ahead order ``privacy.json`` covers at least the checkpoint's steps (more when the run
    was killed after a log or checkpoint step whose checkpoint did not survive): it stays the truth, and the
    replayed steps it covers are not recorded again. A ledger behind the checkpoint (written by an older
    privlm, which saved it after the checkpoint) is replaced by the checkpoint's when it is a prefix of it."""
    if event is None:
        return Ledger(), state.step
    held = state.ledger.count
    if held != state.step:
        raise UserError(f"{state.path}: its ledger covers {held} steps but it was written at step {state.step}")
    if not path.exists():
        return state.ledger, state.step
    on_disk = Ledger.load(path)
    if on_disk.run is not None and state.ledger.run is not None and on_disk.run != state.ledger.run:
        raise UserError(
            f"{path} is run {on_disk.run}'s ledger but {state.path} was written by run {state.ledger.run}; "
            "the run folder is inconsistent"
        )
    for entry in on_disk:
        if entry.event != event:
            raise UserError(f"{path}: ledger event {entry.event} differs from this run's {event}")
    covered = on_disk.count
    if covered >= state.step:
        return on_disk, covered
    if state.ledger.entries[: len(on_disk)] == on_disk.entries:
        return state.ledger, state.step
    raise UserError(
        f"{path} covers {covered} steps, fewer than {state.path} ({state.step}), and is not a prefix "
        "of the checkpoint's ledger; the run folder is inconsistent"
    )


def _empty_batch(run: Run) -> Any:
    """A batch with zero rows and the structure of a real one (a rank's share may be empty)."""
    return take_rows(run.collate([run.rows[0]]), 0, 0)
