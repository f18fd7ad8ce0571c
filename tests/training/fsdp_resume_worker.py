"""Helper script for the ``--fsdp`` training-loop tests (not collected by pytest): the training loop on a
float64 tiny Llama (embedding frozen), one process (plain ``python``) or FSDP2 under ``torchrun``.

    python fsdp_resume_worker.py RUN_DIR OUT [--crash-at 4]

Trains 6 seeded DP-SGD steps (noise on, a checkpoint every 2 steps) into RUN_DIR; with ``--crash-at S``
every rank stops after step S (its checkpoint written), then a fresh model resumes from RUN_DIR. Rank 0
writes ``OUT`` (torch.save): the trainable weights gathered whole and the released DP losses.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from privlm.resources.tiny import build_tiny_model
from privlm.training import checkpoint as ckpt
from privlm.training.data import TaskData, encode, make_collate
from privlm.training.distributed import init_from_env
from privlm.training.loop import TrainConfig, prepare, train_loop

TEXTS = tuple(f"text {i}: " + "the film was great and warm " * (1 + i % 3) for i in range(12))


class Crash(RuntimeError):
    """The simulated kill."""


def prepared(ctx):
    model, tokenizer = build_tiny_model("tiny-llama", seed=0, dtype=torch.float64)
    model.get_input_embeddings().weight.requires_grad_(False)
    model.train()
    config = TrainConfig(
        task="lm",
        noise_multiplier=1.0,
        batch_size=4,
        epochs=2,
        seed=0,
        checkpoint_every=2,
        log_every=1,
        fsdp=ctx.world > 1,
    )
    rows = encode(TaskData("lm", TEXTS, (), None), tokenizer, max_length=24)
    return prepare(model, rows, make_collate(tokenizer), config, ctx)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out")
    parser.add_argument("--crash-at", type=int)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = init_from_env()

    def crash(step, total, loss, epsilon):
        if step == args.crash_at:
            raise Crash

    run = prepared(ctx)
    try:
        train_loop(run, args.run_dir, on_progress=crash)
    except Crash:
        run = prepared(ctx)
        train_loop(run, args.run_dir, resume=True)
    weights = ckpt.trainable_state(run.module)  # gathered: every rank calls it
    if ctx.is_main:
        released = [
            json.loads(line).get("dp_loss") for line in (args.run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        torch.save({"weights": weights, "released": released}, args.out)


if __name__ == "__main__":
    main()
