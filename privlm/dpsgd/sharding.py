"""DP-SGD on a model sharded by FSDP2 (``torch.distributed.fsdp.fully_shard``): what changes at the noise.

Under FSDP2 every trainable parameter is a ``DTensor`` sharded on dimension 0 across the ranks of its device
mesh (``Shard(0)``), each rank holding a contiguous block of rows. The per-sample norms need nothing new: the
layer hooks see each call's input and output-gradient (the full, all-gathered weight is used inside the
call), so every norm mode computes the norm of each of *this rank's* examples exactly as one process would,
and the randomized modes' probes are drawn full size from the step's shared probe key (the same matrix on
every rank, whatever the number of ranks). The book-keeping clipped sum of a rank's examples is full size
(Σ over its examples of c_i g_i, as one process forms it). At the step, :func:`reduce_to_shards` sums those
over the ranks and keeps this rank's rows; the optimizer adds the noise of those rows only
(:meth:`privlm.randomness.SecureRandom.gradient_noise`: the slice of the one-process draw) and sets a sharded
``.grad``. Every rank runs as many forward/backward passes as the rank with the most micro-batches
(:func:`passes_behind`; FSDP2 gathers inside each pass), the extra ones on a filler row whose result is dropped. The update is therefore the one-process update, with the one-process noise, on any number of
ranks (``tests/dpsgd/test_sharding.py``: 2 gloo processes against 1, all five norm modes).

Assumptions and limits (said again in ``docs/scaling-out.md``): every trainable parameter is sharded by the
same mesh (``fully_shard`` on the root module too) on dimension 0; the clipped sum is accumulated full size
on each rank until the step (the gradient memory is not sharded: 1× the trainable parameters per rank,
small with LoRA); the second-backward clipped sum is refused (autograd does not reach the sharded
parameters, FSDP2's unsharded copies take their gradients). The guarantee is the one-process guarantee:
ranks and links are trusted (the keys travel over the process group in clear).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard

from privlm.errors import UserError


def is_sharded(param: Tensor) -> TypeGuard[DTensor]:
    """True for a ``DTensor`` parameter (FSDP2)."""
    return isinstance(param, DTensor)


def check_sharding(params: Sequence[nn.Parameter], bookkeeping: bool) -> bool:
    """True when the trainable ``params`` are sharded (FSDP2), False when none is; :class:`UserError` for a
    mix, a placement other than one ``Shard(0)``, or the second-backward clipped sum."""
    sharded = [is_sharded(p) for p in params]
    if not any(sharded):
        return False
    if not all(sharded):
        raise UserError(
            "some trainable parameters are sharded (FSDP2) and some are not: call fully_shard on the root module "
            "too, so that every trainable parameter is sharded by the same mesh"
        )
    for p in params:
        placements = p.placements if is_sharded(p) else ()
        if len(placements) != 1 or placements[0] != Shard(0):
            raise UserError(f"a trainable parameter is placed as {placements}; DP-SGD supports FSDP2's Shard(0)")
    if not bookkeeping:
        raise UserError(
            "the second-backward clipped sum does not reach FSDP2-sharded parameters; use book-keeping (the default)"
        )
    return True


def local_rows(param: DTensor) -> tuple[int, int]:
    """The rows ``(start, stop)`` of dimension 0 that this rank holds: ``Shard(0)`` cuts them like
    ``torch.chunk`` (⌈n/world⌉ rows per rank, the last ranks fewer or none)."""
    mesh = param.device_mesh
    world, rank = mesh.size(), mesh.get_local_rank()
    rows = param.shape[0]
    size = -(-rows // world)
    start, stop = min(rows, rank * size), min(rows, (rank + 1) * size)
    local = param.to_local().shape
    if local[0] != stop - start:
        raise UserError(f"unexpected FSDP2 shard of {local[0]} rows (expected {stop - start} of {rows})")
    return start, stop


def reduce_to_shards(sums: dict[nn.Parameter, Tensor], loss_sum: Tensor) -> tuple[dict[nn.Parameter, Tensor], Tensor]:
    """Sum each sharded parameter's full-size clipped sum (and the clamped loss sum) over the ranks of its
    mesh and keep this rank's rows (a sum over ranks of exact sums: the clipped sum of the whole batch).
    Parameters that are not sharded pass through."""
    out: dict[nn.Parameter, Tensor] = {}
    group, device = None, None
    for p, g in sums.items():
        rows = noise_rows(p)
        out[p] = g
        if rows is not None:
            group, device = _group(p), g.device
            dist.all_reduce(g, group=group)
            out[p] = g[rows[0] : rows[1]].contiguous()
    if group is not None:
        reduced = loss_sum.to(device, copy=True)  # NCCL reduces device tensors only
        dist.all_reduce(reduced, group=group)
        loss_sum = reduced.cpu()
    return out, loss_sum


def as_grad(param: Tensor, local: Tensor) -> Tensor:
    """``local`` (this rank's rows) placed like ``param`` — its gradient, or any parameter-shaped state: a
    ``DTensor`` for a sharded parameter, ``local`` itself otherwise."""
    if not is_sharded(param):
        return local
    return DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )


def gathered(tensor: Tensor) -> Tensor:
    """The full tensor of a ``DTensor`` (a collective), else ``tensor``; detached."""
    return (tensor.full_tensor() if is_sharded(tensor) else tensor).detach()


def local_part(param: DTensor, full: Tensor) -> Tensor:
    """This rank's rows of ``full`` (a whole ``param``-shaped tensor), on the shard's device and dtype."""
    start, stop = local_rows(param)
    return full[start:stop].to(param.to_local().device, param.dtype).contiguous()


def like_param(param: Tensor, full: Tensor) -> Tensor:
    """``full`` (the whole parameter-shaped tensor) as ``param`` holds it: its rows as a ``DTensor`` placed like
    ``param`` when ``param`` is sharded, else ``full``."""
    return as_grad(param, local_part(param, full)) if is_sharded(param) else full


def noise_rows(param: nn.Parameter) -> tuple[int, int] | None:
    """The rows of ``param``'s noise this rank draws: its shard's, or None (all of them) when not sharded."""
    return local_rows(param) if is_sharded(param) else None


def _group(param: Tensor) -> dist.ProcessGroup | None:
    """The process group of a sharded parameter's (one-dimensional) mesh."""
    return param.device_mesh.get_group() if is_sharded(param) else None


def passes_behind(params: Sequence[Tensor], passes: int) -> int:
    """How many fewer forward/backward passes this rank's ``passes`` are than the most of any rank of the
    sharded ``params``' mesh (a collective, before the passes run): FSDP2 all-gathers the weights inside every
    pass, so every rank must run the same number, the short ones on filler rows. The counts of micro-batches
    are functions of the batch shares (private statistics): exchanged between the trusted ranks, never
    released."""
    if not params or not is_sharded(params[0]):
        return 0
    group, device = params[0].device_mesh.get_group(), params[0].to_local().device
    most = torch.tensor([passes], dtype=torch.long, device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
    return int(most.item()) - passes
