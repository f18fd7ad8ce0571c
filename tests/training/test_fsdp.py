"""``--fsdp``: the training loop and ``privlm train`` on a model sharded by FSDP2 over 2 gloo processes,
against one process: a run killed after a checkpoint and resumed on 2 ranks ends with the uninterrupted
one-process weights and DP losses (float64, seeded noise; empty rank shares and gathered checkpoints
included), ``privlm train --fsdp`` under torchrun writes the one-process adapter, test scores and ε, and
what ``--fsdp`` excludes exits 2 with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

# several processes (torchrun / mp.spawn): `make test` runs these alone, after the parallel part (Makefile)
pytestmark = pytest.mark.processes

HERE = Path(__file__).parent
WORKER = HERE / "fsdp_resume_worker.py"
PRIVLM = Path(sys.executable).with_name("privlm")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(command: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def test_two_sharded_ranks_killed_and_resumed_end_at_the_one_process_run(tmp_path):
    _run([sys.executable, str(WORKER), str(tmp_path / "one"), str(tmp_path / "one.pt")])
    _run([*TORCHRUN, str(WORKER), str(tmp_path / "two"), str(tmp_path / "two.pt"), "--crash-at", "4"])
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert len(one["weights"]) == 19 and len(one["released"]) == 6
    for name, value in one["weights"].items():
        torch.testing.assert_close(two["weights"][name], value, rtol=0, atol=1e-12)
    assert two["released"] == one["released"]  # every step released once, with the same noise


def test_privlm_train_fsdp_under_torchrun_writes_the_one_process_adapter(tmp_path):
    args = [
        "train", "--model", "tiny-llama", "--data", "rotten-tomatoes", "--no-head-only", "--lora", "4",
        "--max-train", "48", "--max-test", "16", "--batch-size", "16", "--epochs", "2", "--epsilon", "8",
        "--seed", "5", "--checkpoint-every", "2", "--json",
    ]  # fmt: skip
    one = json.loads(_run([str(PRIVLM), *args, "--out", str(tmp_path / "one")]).stdout)
    two = json.loads(_run([*TORCHRUN, str(PRIVLM), *args, "--fsdp", "--out", str(tmp_path / "two")]).stdout)
    assert two["world_size"] == 2 and two["steps"] == one["steps"] == 6
    assert two["epsilon"] == one["epsilon"] and two["test"] == one["test"]
    a = load_file(str(tmp_path / "one" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "two" / "adapter" / "adapter_model.safetensors"))
    assert sorted(a) == sorted(b) and len(a) > 0
    for name, value in a.items():  # float32: summation order over ranks
        torch.testing.assert_close(b[name], value, rtol=0, atol=1e-6)
    assert not list((tmp_path / "two").glob("checkpoint-*"))  # retired, as on one process


@pytest.mark.parametrize(
    "extra, reason",
    [
        (["--no-dp"], "excludes --head-only, --train-layers"),
        (["--second-backward", "--lora", "4", "--no-head-only"], "excludes"),
        ([], "excludes --head-only"),  # classify without --lora trains head-only
    ],
)
def test_what_fsdp_excludes_exits_2_with_the_reason(tmp_path, extra, reason):
    done = subprocess.run(
        [str(PRIVLM), "train", "--model", "tiny-llama", "--data", "rotten-tomatoes", "--fsdp", *extra,
         *([] if "--no-dp" in extra else ["--epsilon", "3"]), "--out", str(tmp_path / "o")],
        env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and reason in done.stderr.replace("\n", " ")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "extra, reason",
    [
        (["--lora", "4"], "launch it as torchrun"),  # one process: nothing to shard over
        (["--task", "lm"], "cannot train a tied embedding"),  # full fine-tuning of the tied tiny Llama
    ],
)
def test_fsdp_without_torchrun_or_with_a_trained_tied_embedding_exits_2(tmp_path, extra, reason):
    done = subprocess.run(
        [str(PRIVLM), "train", "--model", "tiny-llama", "--data", "rotten-tomatoes", "--no-head-only", "--fsdp",
         "--epsilon", "3", "--max-train", "16", *extra, "--out", str(tmp_path / "o")],
        env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert reason in done.stderr.replace("\n", " ")
