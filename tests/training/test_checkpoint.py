"""Checkpoints: a folder is complete or absent, older ones are removed, contents round-trip."""

from __future__ import annotations

import pickle

import pytest
import torch

from privlm.errors import UserError
from privlm.privacy import Ledger, PoissonGaussianStep
from privlm.resources.tiny import build_tiny_model
from privlm.training import checkpoint as ckpt

EVENT = PoissonGaussianStep(0.1, 1.2)


def _model():
    model, _ = build_tiny_model("tiny-gpt2", seed=1)
    for name, p in model.named_parameters():
        p.requires_grad_("ln_" in name or "wte" in name)
    return model


def test_round_trip_and_only_the_latest_checkpoint_is_kept(tmp_path):
    model = _model()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    gen = torch.Generator().manual_seed(5)
    ledger = Ledger()
    ledger.record(EVENT, 3, "steps 1-3")
    ckpt.save_checkpoint(
        tmp_path, 3, ckpt.trainable_state(model), optimizer.state_dict(), {"noise": gen.get_state()}, ledger, {"a": 1}
    )
    ledger.record(EVENT, 3, "steps 4-6")
    torch.rand(4, generator=gen)
    ckpt.save_checkpoint(
        tmp_path, 6, ckpt.trainable_state(model), optimizer.state_dict(), {"noise": gen.get_state()}, ledger, {"a": 1}
    )
    expected = torch.rand(4, generator=gen)  # what the generator draws after the checkpoint
    assert [p.name for p in ckpt.checkpoints(tmp_path)] == ["checkpoint-00000006"]
    state = ckpt.load_checkpoint(tmp_path / "checkpoint-00000006")
    assert state.step == 6 and state.meta == {"a": 1, "step": 6}
    assert state.ledger.to_dict() == ledger.to_dict()
    assert set(state.weights) == {n for n, p in model.named_parameters() if p.requires_grad}
    restored = torch.Generator()
    restored.set_state(state.rng["noise"])
    assert torch.equal(torch.rand(4, generator=restored), expected)
    other = _model()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    ckpt.load_trainable_state(other, state.weights)
    for (name, p), q in zip(model.named_parameters(), other.parameters()):
        if p.requires_grad:
            assert torch.equal(p, q), name


def test_a_failed_write_leaves_no_checkpoint_and_no_temporary(tmp_path):
    model = _model()
    with pytest.raises((pickle.PicklingError, AttributeError)):  # a lambda cannot be pickled
        ckpt.save_checkpoint(tmp_path, 2, ckpt.trainable_state(model), {}, {"bad": lambda: None}, Ledger(), {})
    assert ckpt.checkpoints(tmp_path) == [] and list(tmp_path.iterdir()) == []


def test_stale_temporaries_are_removed_and_mismatched_weights_refused(tmp_path):
    (tmp_path / ".checkpoint-abc").mkdir()
    (tmp_path / ".checkpoint-abc" / "trainable.safetensors").write_bytes(b"half")
    assert ckpt.checkpoints(tmp_path) == []
    ckpt.remove_stale_temporaries(tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError, match="trainable parameters"):
        ckpt.load_trainable_state(_model(), {"not.a.parameter": torch.zeros(1)})
