"""Helper script for the distributed tests (not collected by pytest): DP-SGD steps of the training
loop on tiny Llama, on one process (plain ``python``) or under ``torchrun``.

    python dist_worker.py OUT --steps 3 --sigma 2.0

Runs the same seeded training four times — with the noise switched off on the optimizer (clipped
updates only; NOT private, for comparison), with noise multiplier ``sigma``, with the noise off under
Hutchinson norms (probes must not depend on the rank or the shard), and with noise but no seed (the
OS keys drawn on rank 0 must reach every rank) — and writes, per rank,
``OUT.rank<r>.pt``: for each variant the final trainable parameters, the privatized gradient of
the first step, (clipped sum + noise) / expected batch size (``.grad`` after the noise), and the DP
loss released at every step (default loss release).
"""

from __future__ import annotations

import argparse

import torch

from privlm.resources.tiny import build_tiny_model
from privlm.training.data import TaskData, encode, make_collate
from privlm.training.distributed import DistContext, init_from_env
from privlm.training.loop import TrainConfig, prepare, train_loop

TEXTS = [
    f"sample {i}: " + " ".join(["great", "bad", "film", "dull", "warm", "slow"][j % 6] for j in range(i % 7 + 2))
    for i in range(16)
]


VARIANTS = {  # name: (noise off, norm mode, seed)
    "off": (True, "mixed", 7),
    "noisy": (False, "mixed", 7),
    "hutchinson-off": (True, "hutchinson", 7),
    "unseeded": (False, "mixed", None),
}


def train(ctx: DistContext, steps: int, sigma: float, noise_off: bool, norm_mode: str, seed: int | None) -> dict:
    model, tokenizer = build_tiny_model("tiny-llama", seed=0)
    model.train()
    rows = encode(TaskData("lm", tuple(TEXTS), (), None), tokenizer, max_length=24)
    config = TrainConfig(
        task="lm",
        noise_multiplier=sigma,
        batch_size=8,
        epochs=steps / 2,
        lr=1e-2,
        probes=8,
        seed=seed,
        norm_mode=norm_mode,
        max_grad_norm=0.5,
        log_every=1000,
    )
    run = prepare(model, rows, make_collate(tokenizer), config, ctx)
    assert run.total_steps == steps
    if noise_off:
        run.optimizer.noise_multiplier = 0.0
    first_grads: dict[str, torch.Tensor] = {}
    released: list[float] = []

    def keep_first_grads(step: int, total: int, loss: float | None, epsilon: float | None) -> None:
        released.append(run.optimizer.released_loss)
        if step == 1:
            first_grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad})

    train_loop(run, on_progress=keep_first_grads)
    params = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {
        "params": params,
        "first_grads": first_grads,
        "expected_batch": run.sample_rate * len(rows),
        "released": released,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sigma", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = init_from_env()
    result = {name: train(ctx, args.steps, args.sigma, *spec) for name, spec in VARIANTS.items()}
    torch.save(result, f"{args.out}.rank{ctx.rank}.pt")


if __name__ == "__main__":
    main()
