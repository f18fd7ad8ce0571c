"""``privlm train --fsdp``: the model sharded by FSDP2 (``fully_shard``) over the ``torchrun`` ranks.

Each decoder block and the root are sharded on dimension 0 over a one-dimensional mesh of all ranks; DP-SGD
then runs through :mod:`privlm.dpsgd.sharding` (per-sample norms from each rank's own examples, clipped sums
summed into each rank's rows, per-shard noise: the one-process update). What a run writes is gathered:
checkpoints hold the full trainable weights and optimizer state (so they resume on the same number of ranks,
checked like any other setting), and the saved model or adapter is the full one. Every function here that
gathers is a collective: all ranks call it, in the same order.

Refused with one line: a trained tied embedding (both uses would sit in one sharded parameter that FSDP2
gathers for two modules), and what :func:`privlm.dpsgd.sharding.check_sharding` refuses.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from privlm.dpsgd.sharding import gathered, is_sharded, like_param
from privlm.errors import UserError
from privlm.training.distributed import DistContext
from privlm.training.top_blocks import decoder_parts


def shard_model(module: nn.Module, ctx: DistContext) -> None:
    """``fully_shard`` every decoder block of ``module`` (a causal LM or a peft model wrapping one), then the
    root, over all ``ctx.world`` ranks (CPU: gloo; CUDA: the current device)."""
    parts = decoder_parts(module)
    embedding = parts.causal_lm.get_input_embeddings()
    if embedding is not None and embedding.weight.requires_grad and embedding.weight is parts.output.weight:
        raise UserError(
            "--fsdp cannot train a tied embedding (input embedding = output layer): freeze it (--lora R) or untie it"
        )
    if not ctx.enabled:
        raise UserError(
            "--fsdp shards the model over torchrun's ranks: launch it as "
            "torchrun --nproc-per-node N $(which privlm) train --fsdp ... (N >= 2)"
        )
    device = "cuda" if next(module.parameters()).is_cuda else "cpu"
    mesh = init_device_mesh(device, (ctx.world,))
    for block in parts.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)


def gathered_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every sharded state tensor gathered (a collective)."""
    state = optimizer.state_dict()
    state["state"] = {
        index: {key: gathered(value) if isinstance(value, Tensor) else value for key, value in entry.items()}
        for index, entry in state["state"].items()
    }
    return state


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a :func:`gathered_optimizer_state` into ``optimizer``, re-sharding each parameter-shaped state
    tensor like its parameter."""
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        for param in group["params"]:
            entry = optimizer.state.get(param, {})
            for key, value in entry.items():
                if isinstance(value, Tensor) and is_sharded(param) and value.shape == param.shape:
                    entry[key] = like_param(param, value)


def full_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """The whole model's weights by name, gathered on rank 0 (CPU; empty on the other ranks): what
    ``save_pretrained(state_dict=...)`` writes. A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
