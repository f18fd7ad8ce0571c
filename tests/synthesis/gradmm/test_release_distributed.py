"""Data-parallel release under torch.distributed (gloo, 2 processes): sums all-reduced, noise drawn once."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.gradmm.release import add_gaussian_noise, clipped_class_sums
from privlm.training.distributed import leave_group

# several processes (torchrun / mp.spawn): `make test` runs these alone, after the parallel part (Makefile)
pytestmark = pytest.mark.processes

EXAMPLES = [
    (f"the film was {w}", i % 2) for i, w in enumerate(["good", "bad", "slow", "warm", "dull", "great", "long"])
]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, tokenizer = build_tiny_model("tiny-llama", dtype=torch.float64)
        prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
        sums = clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=0.5, max_tokens=64, batch_size=2)
        noisy = add_gaussian_noise(sums, 1.0)
        torch.save({"sums": sums, "noisy": noisy}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        leave_group()


def test_two_ranks_give_the_single_process_sum_and_one_shared_noise_draw(tmp_path) -> None:
    port = 29500 + os.getpid() % 1000
    mp.spawn(_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    model, tokenizer = build_tiny_model("tiny-llama", dtype=torch.float64)
    prompt = build_prompt(tokenizer, " It was ", ["bad", "great"])
    # Each rank sums examples[rank::2] in batches of 2: the all-reduced sum is exactly those two sums added.
    shards = sum(
        clipped_class_sums(model, tokenizer, EXAMPLES[r::2], prompt, clip=0.5, max_tokens=64, batch_size=2)
        for r in range(2)
    )
    single = clipped_class_sums(model, tokenizer, EXAMPLES, prompt, clip=0.5, max_tokens=64)
    for r in ranks:
        torch.testing.assert_close(r["sums"], shards, rtol=1e-12, atol=1e-14)
        # Against one process with other batches only to float32 precision: transformers' eager attention
        # takes its softmax in float32 even in a float64 model, so padding changes the last bits.
        torch.testing.assert_close(r["sums"], single, rtol=1e-5, atol=1e-7)
    assert torch.equal(ranks[0]["noisy"], ranks[1]["noisy"])  # drawn once on rank 0, broadcast
    noise = ranks[0]["noisy"] - ranks[0]["sums"]
    assert 0.9 < float(noise.std()) < 1.1
