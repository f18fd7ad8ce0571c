"""Helper script for the FSDP2 tests (not collected by pytest): DP-SGD steps through ``PrivacyEngine`` on a
float64 tiny Llama, on one process (plain ``python``) or sharded by FSDP2 under ``torchrun`` (gloo).

    python fsdp_worker.py OUT --modes exact,ghost,mixed,hutchinson,hutchpp --steps 3

For each norm mode (and ``mixed+lora``: peft LoRA adapters): the same seeded engine (sampler, probe and noise keys from one seed), σ = 1, AdamW;
every rank takes its share ``i ≡ rank (mod world)`` of each Poisson batch. Writes ``OUT.rank<r>.pt``: per
mode the full trainable parameters after the steps (gathered from the shards), the released DP losses, and
the parameters and optimizer state this rank holds (element counts: the memory FSDP2 shards).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

from privlm.dpsgd import LossRelease, PrivacyEngine
from privlm.dpsgd.losses import causal_lm_losses
from privlm.resources.tiny import build_tiny_model
from privlm.training.data import TaskData, encode, make_collate
from privlm.training.distributed import leave_group
from privlm.training.top_blocks import decoder_parts

TEXTS = [
    f"row {i}: " + " ".join(["one", "two", "red", "sun", "hat", "map"][j % 6] for j in range(i % 5 + 3))
    for i in range(24)
]


def local_numel(tensor: torch.Tensor) -> int:
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).numel()


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def train(variant: str, steps: int, rank: int, world: int) -> dict:
    mode, _, lora = variant.partition("+")  # "mixed+lora": peft LoRA adapters, all else frozen
    model, tokenizer = build_tiny_model("tiny-llama", seed=0, dtype=torch.float64)
    model.model.embed_tokens.weight.requires_grad_(False)  # tied to the head: frozen (docs/scaling-out.md)
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)  # lora_A's initial values: the same on every rank (the loop broadcasts rank 0's)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
        with torch.no_grad():  # a non-zero B, so that A's gradients are non-zero too
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype))
    if world > 1:
        mesh = init_device_mesh("cpu", (world,))
        for block in decoder_parts(model).blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    rows = encode(TaskData("lm", tuple(TEXTS), (), None), tokenizer, max_length=24)
    engine = PrivacyEngine(norm_mode=mode, probes=4, seed=11)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    private, dp_optimizer, loader = engine.make_private(
        model,
        optimizer,
        DataLoader(rows, batch_size=8, collate_fn=make_collate(tokenizer)),
        noise_multiplier=1.0,
        max_grad_norm=0.5,
        loss_fn=lambda m, b: causal_lm_losses(m, b, reduction="mean"),
        loss_release=LossRelease(10.0, 0.2),
    )
    released = []
    for step, batch in enumerate(loader):
        if step == steps:
            break
        dp_optimizer.zero_grad()
        mine = {k: v[rank::world] for k, v in batch.items()}
        private.clipped_backward(mine)  # on every rank, even with no rows: FSDP2 needs every rank's pass
        dp_optimizer.step()
        released.append(dp_optimizer.released_loss)
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.dim()]
    return {
        "params": {n: full(p) for n, p in model.named_parameters() if p.requires_grad},
        "released": released,
        "epsilon": engine.epsilon(1e-5),
        "local_param_numel": sum(local_numel(p) for p in params),
        "local_optimizer_numel": sum(local_numel(t) for t in state),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--modes", default="exact,ghost,mixed,hutchinson,hutchpp,mixed+lora")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    result = {mode: train(mode, args.steps, rank, world) for mode in args.modes.split(",")}
    torch.save(result, f"{args.out}.rank{rank}.pt")
    if world > 1:
        leave_group()


if __name__ == "__main__":
    main()
