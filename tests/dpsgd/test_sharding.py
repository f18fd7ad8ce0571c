"""DP-SGD on an FSDP2-sharded model (``fully_shard``, two gloo processes) against one process, through
``PrivacyEngine``: in every norm mode the update with noise (seeded keys) and the released DP losses are the
one-process ones, each rank holds half of the parameters and of the optimizer state, and the refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from privlm.dpsgd.sharding import check_sharding
from privlm.errors import UserError

# several processes (torchrun / mp.spawn): `make test` runs these alone, after the parallel part (Makefile)
pytestmark = pytest.mark.processes

WORKER = Path(__file__).with_name("fsdp_worker.py")
MODES = ("exact", "ghost", "mixed", "hutchinson", "hutchpp", "mixed+lora")  # +lora: peft adapters only


def _run(out: Path, processes: int) -> list[dict]:
    launcher = (
        [sys.executable]
        if processes == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    )
    done = subprocess.run(
        [*launcher, str(WORKER), str(out), "--modes", ",".join(MODES), "--steps", "3"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [torch.load(f"{out}.rank{r}.pt") for r in range(processes)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("fsdp")
    return {"one": _run(tmp / "one", 1), "two": _run(tmp / "two", 2)}


@pytest.mark.parametrize("mode", MODES)
def test_two_sharded_processes_take_the_one_process_update(runs, mode):
    from privlm.resources.tiny import build_tiny_model

    (one,), two = runs["one"], runs["two"]
    initial = dict(build_tiny_model("tiny-llama", seed=0, dtype=torch.float64)[0].named_parameters())
    single = one[mode]
    base = {n.removeprefix("base_model.model.").replace(".base_layer", ""): v for n, v in single["params"].items()}
    assert all(n not in initial or not torch.equal(v, initial[n]) for n, v in base.items())  # trained weights moved
    assert len(single["params"]) == (12 if "lora" in mode else 19)  # 2 blocks × (4 + 3 + 2 norms), final norm
    for rank in two:
        for name, value in single["params"].items():  # noise included: the same draw, sliced per shard
            torch.testing.assert_close(rank[mode]["params"][name], value, rtol=0, atol=1e-12)
        assert rank[mode]["released"] == single["released"]  # the DP losses: clamped sums reduced over ranks
        assert rank[mode]["epsilon"] == single["epsilon"]  # accounting unchanged


def test_each_rank_holds_half_of_the_parameters_and_optimizer_state(runs):
    single = runs["one"][0]["mixed"]
    for rank in runs["two"]:
        held = rank["mixed"]
        assert held["local_param_numel"] == pytest.approx(single["local_param_numel"] / 2, rel=0.05)
        assert held["local_optimizer_numel"] == pytest.approx(single["local_optimizer_numel"] / 2, rel=0.05)


@pytest.fixture
def one_rank_group():
    """A one-process gloo group (FSDP2 needs one to shard, even over one rank)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_a_half_sharded_model_and_the_second_backward_are_refused(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from privlm.dpsgd import PerSampleClipper
    from privlm.dpsgd.losses import causal_lm_losses
    from privlm.resources.tiny import build_tiny_model

    model = build_tiny_model("tiny-llama", seed=0, dtype=torch.float64)[0]
    model.model.embed_tokens.weight.requires_grad_(False)
    mesh = init_device_mesh("cpu", (1,))
    fully_shard(model.model.layers[0], mesh=mesh)  # the root is not sharded
    params = [p for p in model.parameters() if p.requires_grad]
    assert check_sharding([p for p in params if type(p) is nn.Parameter], bookkeeping=False) is False
    with pytest.raises(UserError, match="fully_shard on the root module"):
        check_sharding(params, bookkeeping=True)
    fully_shard(model, mesh=mesh)
    params = [p for p in model.parameters() if p.requires_grad]
    assert check_sharding(params, bookkeeping=True) is True
    with pytest.raises(UserError, match="second-backward"):
        PerSampleClipper(model, causal_lm_losses, max_grad_norm=1.0, bookkeeping=False)


def test_the_fsdp2_example_trains_and_saves_the_gathered_weights(tmp_path):
    """``examples/fsdp_private.py`` under torchrun (2 gloo processes): every planned step taken (3, more than
    the 2 of one pass over 64 rows at B = 32), ε at the target, full-size weights."""
    from safetensors.torch import load_file

    example = Path(__file__).parents[2] / "examples" / "fsdp_private.py"
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    done = subprocess.run(
        [*launcher, str(example), "--out", str(tmp_path / "out"), "--steps", "3", "--max-train", "64"],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((tmp_path / "out" / "privacy.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3 and 0 < summary["epsilon"] <= 3.0 + 1e-6
    weights = load_file(str(tmp_path / "out" / "trainable.safetensors"))
    assert weights["model.layers.0.mlp.down_proj.weight"].shape == (32, 64)  # gathered, not one rank's half
