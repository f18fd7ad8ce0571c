"""DP-SGD on a model sharded by FSDP2 (``fully_shard``), launched with ``torchrun``: the lines that differ
from one process are marked ``# FSDP2``.

    torchrun --standalone --nproc-per-node=2 examples/fsdp_private.py --out runs/fsdp-example
    torchrun --standalone --nproc-per-node=8 examples/fsdp_private.py --model smollm2-135m --norm-mode hutchinson \\
        --epsilon 3 --steps 200 --out runs/fsdp-smollm2            # on GPUs: NCCL is chosen when CUDA is there

Every rank loads the same model, shards each decoder block and the root over the ranks, and takes its share
(``i ≡ rank mod world``) of each Poisson batch; ``PrivacyEngine`` computes each example's norm on the rank
that holds it, sums the clipped sums over the ranks into each rank's shard, and adds the noise of that
shard's rows only (``privlm.dpsgd.sharding``): the update is the one-process update. The private text here
is the embedded Rotten Tomatoes train split (the causal-LM loss of each review); the tied input embedding
stays frozen (a trained tied embedding is refused under FSDP2). Writes ``OUT/trainable.safetensors`` (the
full trainable weights, gathered on rank 0) and ``OUT/privacy.json`` (ε at δ, the accounting).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader

from privlm.dpsgd import PrivacyEngine
from privlm.dpsgd.losses import causal_lm_losses
from privlm.resources.models import load_model
from privlm.training.data import encode, load_task_data, make_collate
from privlm.training.distributed import context, shared_streams
from privlm.training.top_blocks import decoder_parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--norm-mode", default="mixed")
    parser.add_argument("--epsilon", type=float, default=3.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--max-train", type=int, default=512)
    args = parser.parse_args()
    if not dist.is_initialized():  # FSDP2: the process group torchrun describes (gloo on CPU, NCCL on GPU)
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    ctx = context()
    device = torch.device(f"cuda:{ctx.rank % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_model(args.model, seed=0)
    model.to(device)
    model.get_input_embeddings().weight.requires_grad_(False)  # tied to the output layer: frozen
    mesh = init_device_mesh(device.type, (ctx.world,))  # FSDP2
    for block in decoder_parts(model).blocks:  # FSDP2
        fully_shard(block, mesh=mesh)  # FSDP2
    fully_shard(model, mesh=mesh)  # FSDP2: the root too, so every trainable parameter is sharded
    model.train()

    data = load_task_data("rotten-tomatoes", "lm")
    rows = encode(replace(data, train=data.train[: args.max_train]), tokenizer, args.max_length)
    engine = PrivacyEngine(norm_mode=args.norm_mode, streams=shared_streams(None, ctx))  # FSDP2: rank 0's keys
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    epochs = args.steps * args.batch_size / len(rows)
    private, dp_optimizer, loader = engine.make_private(
        model,
        optimizer,
        DataLoader(rows, batch_size=args.batch_size, collate_fn=make_collate(tokenizer)),
        max_grad_norm=1.0,
        target_epsilon=args.epsilon,
        delta=args.delta,
        epochs=epochs,
        loss_fn=lambda m, b: causal_lm_losses(m, b, reduction="mean"),
    )
    planned = math.ceil(epochs * math.ceil(len(rows) / args.batch_size))
    passes = (batch for _ in itertools.count() for batch in loader)  # each pass continues the step numbers
    for _, batch in zip(range(planned), passes):
        dp_optimizer.zero_grad()
        mine = {k: v[ctx.rank :: ctx.world].to(device) for k, v in batch.items()}  # FSDP2: this rank's share
        private.clipped_backward(mine)  # on every rank, even with no rows: FSDP2 needs every rank's pass
        dp_optimizer.step()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # FSDP2: gathered on rank 0
    weights = get_model_state_dict(model, options=options)
    if ctx.is_main:
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        args.out.mkdir(parents=True, exist_ok=True)
        save_file(
            {n: w.contiguous() for n, w in weights.items() if n in trainable}, str(args.out / "trainable.safetensors")
        )
        summary = {
            "model": args.model,
            "norm_mode": args.norm_mode,
            "world_size": ctx.world,
            "steps": engine.steps,
            "noise_multiplier": dp_optimizer.noise_multiplier,
            "epsilon": engine.epsilon(args.delta),
            "delta": args.delta,
            "private_release": engine.private_release,
        }
        (args.out / "privacy.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(json.dumps(summary))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
