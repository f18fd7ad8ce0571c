"""bf16 mixed precision: forward/backward under autocast, norms, clip factors and clipped sums in float32.

Reference: the same model and batch in float32 without autocast. Stated tolerance: per-sample norms within
3 % and clipped sums within 5 % (relative Frobenius error per parameter) of float32 — bf16 keeps 8 bits
of mantissa in the activations and backprops the factors are built from; what the tests pin down is that
the accumulation itself is float32 (dtype checks) and that the accountant sees the same event."""

from __future__ import annotations

import pytest
import torch
from dpsgd_harness import padded_batch, tiny_model
from torch.utils.data import DataLoader

from privlm.dpsgd.clipping import PerSampleClipper
from privlm.dpsgd.engine import PrivacyEngine
from privlm.dpsgd.losses import causal_lm_losses
from privlm.errors import UserError
from privlm.randomness import SecureRandom

MODES = ["exact", "ghost", "mixed", "hutchinson", "hutchpp"]


def _clip(model, batch, mode: str, autocast: bool, bookkeeping: bool = True):
    probes = SecureRandom.from_seed(0, "probes")  # the same probes in both runs
    clipper = PerSampleClipper(
        model,
        causal_lm_losses,
        max_grad_norm=0.05,
        norm_mode=mode,
        probes=6,
        randomness=probes,
        bookkeeping=bookkeeping,
    )
    clipper.begin_step(1)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            stats = clipper.clipped_backward(batch)
        return stats, clipper.pop_summed_grads()
    finally:
        clipper.capture.remove()


@pytest.mark.parametrize("mode", MODES)
def test_bf16_autocast_norms_and_sums_are_float32_and_close(mode: str) -> None:
    model = tiny_model("tiny-llama").float()
    batch = padded_batch([12, 9, 4, 11], seq_len=12, seed=5)
    ref_stats, ref_sums = _clip(model, batch, mode, autocast=False)
    stats, sums = _clip(model, batch, mode, autocast=True)
    assert stats.sq_norms.dtype == torch.float32 and stats.factors.dtype == torch.float32
    torch.testing.assert_close(stats.sq_norms.sqrt(), ref_stats.sq_norms.sqrt(), rtol=3e-2, atol=0)
    for p, s in sums.items():
        assert s.dtype == torch.float32  # accumulated in float32, whatever autocast computed
        assert float((s - ref_sums[p]).norm()) <= 5e-2 * float(ref_sums[p].norm()) + 1e-7


def test_the_second_backward_is_refused_under_autocast() -> None:
    """Its clipped sum would be the bf16 backward itself (each example's weighted gradient rounded before the
    sum); in float32 it runs."""
    model = tiny_model("tiny-llama").float()
    batch = padded_batch([12, 9, 4, 11], seq_len=12, seed=5)
    with pytest.raises(UserError, match="half precision"):
        _clip(model, batch, "mixed", autocast=True, bookkeeping=False)
    stats, _ = _clip(model, batch, "mixed", autocast=False, bookkeeping=False)
    assert torch.isfinite(stats.sq_norms).all()


def test_half_precision_parameters_accumulate_in_float32() -> None:
    model = tiny_model("tiny-llama").to(torch.bfloat16)
    batch = padded_batch([12, 9, 4, 11], seq_len=12, seed=5)
    _, sums = _clip(model, batch, "hutchinson", autocast=False)
    assert {s.dtype for s in sums.values()} == {torch.float32}


def test_mixed_precision_step_keeps_float32_master_weights_and_the_same_event() -> None:
    events, dtypes = [], []
    for autocast in (False, True):
        model = tiny_model("tiny-llama").float()
        engine = PrivacyEngine(norm_mode="hutchinson", probes=6, seed=0)
        rows = [padded_batch([8], seq_len=8, seed=s) for s in range(8)]
        rows = [{k: v[0] for k, v in r.items()} for r in rows]
        loader = DataLoader(rows, batch_size=4)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        private, dp_opt, poisson = engine.make_private(model, opt, loader, max_grad_norm=1.0, noise_multiplier=1.0)
        batch = next(iter(poisson))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            private.clipped_backward(batch)
        dp_opt.step()
        private.clipper.capture.remove()
        events.append(engine.event)
        dtypes.append(
            {p.dtype for p in model.parameters()} | {p.grad.dtype for p in model.parameters() if p.grad is not None}
        )
    assert events[0] == events[1]  # the accountant is unchanged by the precision
    assert dtypes == [{torch.float32}, {torch.float32}]


def test_train_loop_under_bf16_precision_matches_float32_closely() -> None:
    """``TrainConfig(precision="bf16")``: the loop's steps run under autocast; the weights stay float32
    and end close to the float32 run's (same seeded sampling, probes and noise)."""
    from privlm.errors import UserError
    from privlm.training.loop import TrainConfig, prepare, train_loop

    rows = [{k: v[0] for k, v in padded_batch([10], seq_len=10, seed=s).items()} for s in range(16)]

    def collate(batch):
        return {k: torch.stack([r[k] for r in batch]) for k in batch[0]}

    finals = []
    for precision in ("float32", "bf16"):
        model = tiny_model("tiny-llama").float()
        config = TrainConfig(
            task="lm", noise_multiplier=1.0, batch_size=4, epochs=1, lr=1e-2, seed=3, precision=precision
        )
        train_loop(prepare(model, rows, collate, config))
        finals.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert finals[1].dtype == torch.float32
    assert not torch.equal(finals[1], finals[0])  # autocast did run the steps in bf16
    assert float((finals[1] - finals[0]).norm()) <= 2e-2 * float(finals[0].norm())
    with pytest.raises(UserError, match="--precision must be one of"):
        TrainConfig(task="lm", noise_multiplier=1.0, precision="fp8")
