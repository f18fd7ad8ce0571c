"""Two gloo processes (``torchrun``) against one process, on tiny Llama: with the noise off the
training runs agree (clipped sums and the released loss sums alike); with it on, the noise of a
step is drawn once (variance σ²C²/B², not 2σ²C²/B²) and every rank applies the same update and
releases the same DP loss."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# several processes (torchrun / mp.spawn): `make test` runs these alone, after the parallel part (Makefile)
pytestmark = pytest.mark.processes

WORKER = Path(__file__).with_name("dist_worker.py")
SIGMA, CLIP = 2.0, 0.5  # CLIP is the worker's max_grad_norm


def _run(out: Path, processes: int) -> list[dict]:
    launcher = (
        [sys.executable]
        if processes == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [*launcher, str(WORKER), str(out), "--steps", "3", "--sigma", str(SIGMA)],
        check=True,
        env=env,
        capture_output=True,
        timeout=240,
    )
    return [torch.load(f"{out}.rank{r}.pt") for r in range(processes)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("dist")
    return {"one": _run(tmp / "one", 1), "two": _run(tmp / "two", 2)}


def test_two_processes_without_noise_equal_one_process(runs):
    (one,), two = runs["one"], runs["two"]
    single, double = one["off"], two[0]["off"]
    assert any(g.abs().max() > 0 for g in single["first_grads"].values())  # the step did something
    for name, grad in single["first_grads"].items():  # clipped sums: equal up to summation order
        torch.testing.assert_close(double["first_grads"][name], grad, rtol=1e-5, atol=1e-8)
    # After 3 AdamW steps (lr 1e-2): Adam's 1/sqrt(v) can amplify float32 round-off on near-zero
    # coordinates, so the weights are compared at 1e-4 — far below one step (1e-2) in any direction.
    for name, value in single["params"].items():
        torch.testing.assert_close(double["params"][name], value, rtol=0, atol=1e-4)
    # noise-free released losses: the clamped loss sums, all-reduced over ranks, / expected batch size
    assert len(single["released"]) == 3 and all(x > 0 for x in single["released"])
    assert double["released"] == pytest.approx(single["released"], rel=1e-5)


def test_ranks_apply_identical_noisy_updates(runs):
    rank0, rank1 = (r["noisy"] for r in runs["two"])
    for name in rank0["params"]:
        assert torch.equal(rank0["params"][name], rank1["params"][name])
        assert torch.equal(rank0["first_grads"][name], rank1["first_grads"][name])
    assert rank0["released"] == rank1["released"]
    assert rank0["released"] != runs["two"][0]["off"]["released"]  # the DP losses carry noise


def test_noise_is_drawn_once_per_step(runs):
    """Same seed, so the first step samples the same batch with and without noise: the difference of
    the privatized gradients is noise / B, whose variance must be σ²C²/B² (one draw for the step)."""
    clean = runs["one"][0]["off"]
    noisy = runs["two"][0]["noisy"]
    diff = torch.cat([(noisy["first_grads"][n] - g).flatten() for n, g in clean["first_grads"].items()]).double()
    expected_var = (SIGMA * CLIP / clean["expected_batch"]) ** 2
    assert diff.numel() > 20_000  # relative standard error of the variance ≈ sqrt(2/n) < 1%
    assert diff.mean().abs() < 4 * (expected_var / diff.numel()) ** 0.5
    assert diff.var().item() == pytest.approx(expected_var, rel=0.05)


def test_hutchinson_probes_do_not_depend_on_rank_or_shard(runs):
    """Every rank draws the step's probes from the same key at the same address: the two-process clipped
    sums equal the one-process ones in a randomized mode too (examples sit in other micro-batches and
    on other ranks there)."""
    single, double = runs["one"][0]["hutchinson-off"], runs["two"][0]["hutchinson-off"]
    for name, grad in single["first_grads"].items():
        torch.testing.assert_close(double["first_grads"][name], grad, rtol=1e-5, atol=1e-8)


def test_unseeded_runs_share_rank_zeros_os_keys(runs):
    rank0, rank1 = (r["unseeded"] for r in runs["two"])
    for name in rank0["params"]:
        assert torch.equal(rank0["params"][name], rank1["params"][name])
    assert not torch.equal(rank0["first_grads"][name], runs["two"][0]["noisy"]["first_grads"][name])
