"""DP-SGD on several processes with ``torch.distributed`` (``torchrun``; gloo on CPU, NCCL on GPU).

Every rank holds the whole model and the whole (public) index range; rank r owns the shard of
examples ``i ≡ r (mod world)``. Per logical step:

1. Poisson sampling: every rank draws the same inclusion vector (the same sampler key, broadcast
   from rank 0, and the same step address) and keeps the indices of its own shard. Each rank thus Poisson-samples its shard with
   rate q, and the union over ranks is *exactly* one Poisson sample of the full dataset with rate q —
   the sample the accountant assumes (and the one a single process draws with the same seed).
2. Each rank clips its own samples and accumulates their clipped sum (the engine's clipper). The
   probes of a step are the same on every rank (same probe key, addressed by step and parameter), so
   an example's clip factor does not depend on which rank holds it or on what else that rank holds.
3. :func:`all_reduce_clipped_sums` sums the clipped sums over ranks (one flat buffer), and with
   them the clamped loss sums of the DP loss release.
4. The noise is drawn once for the step: every rank holds the same noise key and draws the step's
   addresses, so all ranks add the *same* N(0, σ²C² I) to the same reduced sum and take the same
   update (and release the same DP loss). The total noise is that of one draw — never one draw per rank.

We do not wrap the model in ``DistributedDataParallel``: DDP all-reduces ``.grad`` of the unclipped
loss, whereas DP-SGD must all-reduce the clipped sums; the rest of what DDP does (identical initial
weights) is :func:`broadcast_parameters`. Guarantee: as for one process, provided every rank runs
the same code on the same dataset order (checked by :func:`check_same_on_all_ranks`), and that the
ranks and the links between them are trusted (the keys travel over the process group in clear).
"""

from __future__ import annotations

import atexit
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from privlm.dpsgd.clipping import PerSampleClipper
from privlm.errors import UserError
from privlm.randomness import STREAMS, RunStreams


@dataclass(frozen=True)
class DistContext:
    """This process's rank and the world size (``world == 1``: no process group)."""

    rank: int = 0
    world: int = 1

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_from_env() -> DistContext:
    """Join the process group that ``torchrun`` describes in the environment (``WORLD_SIZE`` > 1), or
    return a one-process context. Backend: NCCL when CUDA is available, gloo otherwise. A group joined here
    is left when the process exits (:func:`leave_group`), not to the interpreter's teardown."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(leave_group)
    return DistContext(dist.get_rank(), dist.get_world_size())


# How long a gloo rank waits at exit, the GIL released, for the backend's worker threads (below).
GLOO_DRAIN_S = 0.2


def leave_group() -> None:
    """Leave the process group (:func:`init_from_env` registers this to run at exit; call it last yourself
    for a group joined elsewhere), while the interpreter is still whole: first let gloo's worker threads drop
    the collectives they finished, then destroy the group.

    Why (measured, gdb on the FSDP kill-and-resume test): a gloo worker thread (``pt_gloo_runloop``) drops
    its reference to a finished collective only after the caller's ``wait()`` has returned. If Python has
    meanwhile dropped the tensors of that collective, dropping it needs the GIL; when that happens after
    interpreter finalization has begun, the thread exits mid-destructor and the process aborts with
    ``terminate called without an active exception`` (SIGABRT, exit -6) after all its work was done.
    ``destroy_process_group`` does not join those threads while anything still holds the group (DTensor
    and FSDP2 do, in C++), so a pause with the GIL released is what narrows the window: the last collective of a run is a
    moments old when ``main`` returns, and a thread descheduled under load (2 ranks on 2 busy
    cores) can miss it by milliseconds. This is a mitigation of a PyTorch race, not a proof: a thread
    kept off the CPU for longer than :data:`GLOO_DRAIN_S` can still abort the rank at exit."""
    if not dist.is_initialized():
        return
    if dist.get_backend() == "gloo":
        time.sleep(GLOO_DRAIN_S)
    dist.destroy_process_group()


def context() -> DistContext:
    """The context of an already initialised process group (or one process)."""
    if dist.is_available() and dist.is_initialized():
        return DistContext(dist.get_rank(), dist.get_world_size())
    return DistContext()


def shard_of(indices: list[int], ctx: DistContext) -> list[int]:
    """The indices this rank owns (``i % world == rank``)."""
    return [i for i in indices if i % ctx.world == ctx.rank] if ctx.enabled else indices


def all_reduce_clipped_sums(clipper: PerSampleClipper, ctx: DistContext) -> None:
    """Replace the clipper's accumulated clipped sums (and clamped loss sum, when it keeps one) by
    their sums over all ranks (before the noise). An FSDP2-sharded model's sums are left alone: its
    optimizer sums them and keeps each rank's rows (:mod:`privlm.dpsgd.sharding`)."""
    if not ctx.enabled or clipper.sharded:
        return
    parts = clipper.pop_summed_grads()
    flat = torch.cat([g.reshape(-1) for g in parts.values()])
    if clipper.loss_bound is not None:
        flat = torch.cat([flat, clipper.pop_summed_loss().to(flat.dtype).to(flat.device).reshape(1)])
    dist.all_reduce(flat)
    offset = 0
    for p, g in parts.items():
        clipper.summed_grads[p] = flat[offset : offset + g.numel()].view_as(g)
        offset += g.numel()
    if clipper.loss_bound is not None:
        clipper.summed_loss = flat[offset].detach().double().cpu()


def all_reduce_grads(params: list[nn.Parameter], ctx: DistContext) -> None:
    """Sum ``.grad`` over ranks (the non-private path); a missing gradient counts as zero."""
    if not ctx.enabled:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def broadcast_parameters(module: nn.Module, ctx: DistContext) -> None:
    """Give every rank rank 0's parameters and buffers (as DDP does at construction)."""
    if not ctx.enabled:
        return
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)


def shared_streams(seed: int | None, ctx: DistContext) -> RunStreams:
    """The sampler, probe and noise keys every rank uses: derived from ``seed`` (not private), or three
    independent OS keys drawn on rank 0 and broadcast, so that all ranks sample, probe and add noise
    identically."""
    streams = RunStreams.create(seed)
    if seed is not None or not ctx.enabled:
        return streams
    keys = torch.stack([getattr(streams, name).key_tensor() for name in STREAMS])
    if dist.get_backend() == "nccl":  # NCCL moves CUDA tensors only
        keys = keys.to(f"cuda:{torch.cuda.current_device()}")
    dist.broadcast(keys, src=0)
    return RunStreams(*(type(streams.noise).from_key_tensor(k, private=True) for k in keys))


def check_same_on_all_ranks(value: Any, what: str, ctx: DistContext) -> None:
    """Raise :class:`UserError` when ``value`` differs between ranks (e.g. dataset size, settings)."""
    if not ctx.enabled:
        return
    values: list[Any] = [None] * ctx.world
    dist.all_gather_object(values, value)
    if any(v != values[0] for v in values):
        raise UserError(f"{what} differs between ranks: {values}")


def gather_objects(value: Any, ctx: DistContext) -> list[Any]:
    """``value`` of every rank, in rank order (on every rank)."""
    if not ctx.enabled:
        return [value]
    values: list[Any] = [None] * ctx.world
    dist.all_gather_object(values, value)
    return values


def barrier(ctx: DistContext) -> None:
    """Wait for all ranks."""
    if ctx.enabled:
        dist.barrier()
