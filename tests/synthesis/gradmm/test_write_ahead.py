"""GRADMM's write-ahead ledger: the entry that accounts for the DP release is durable before the release
tensor (or any batch or text derived from it) is written, and a redraw after a failed draw is not
accounted twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import privlm.synthesis.gradmm.release as release_module
from privlm.privacy import Ledger
from privlm.privacy.events import GaussianRelease
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.pipeline import GradmmPaths, run_gradmm
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.gradmm.release import release_noise_multiplier

PRIVATE = [
    ("a delight from start to finish", 1),
    ("slow, dull and far too long", 0),
    ("warm, funny and moving", 1),
    ("the acting is wooden", 0),
]
CONFIG = make_config("demo", length=3, batch=2, outer_steps=1, inner_steps=2, top_k=4, seed=1, oversample=1.0)
HIDDEN = build_tiny_model("tiny-llama", seed=2)[0].get_output_embeddings().weight.shape[1]
# 2 classes × 2 label rows × d coordinates, snapped with clamp 2¹⁶ (2⁸ times the default's slack each)
SNAPPED = 2 * 2 * HIDDEN * 2**8
EVENT = GaussianRelease(release_noise_multiplier(4.0, 1e-5, SNAPPED), snapped=SNAPPED)


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny-llama", seed=2)
    model.requires_grad_(False)
    return model, tokenizer, build_prompt(tokenizer, " It was ", ["bad", "great"], ["negative", "positive"])


def _run(lm, out: Path, **kwargs):
    model, tokenizer, prompt = lm
    return run_gradmm(
        model,
        tokenizer,
        prompt,
        lambda: list(PRIVATE),
        out=out,
        per_class=1,
        config=CONFIG,
        dp=True,
        epsilon=4.0,
        delta=1e-5,
        **kwargs,
    )


def _entries(out: Path) -> list:
    return [(e.event, e.count) for e in Ledger.load(GradmmPaths(out).ledger)]


def test_the_ledger_is_durable_before_the_release_and_its_text(lm, tmp_path, monkeypatch):
    out = tmp_path / "synth.jsonl"
    seen = []
    save = release_module.Release.save

    def checked_save(self, path):
        seen.append(_entries(out))  # what the ledger on disk says at the moment the release is written
        assert not out.exists() and not list(GradmmPaths(out).batches.glob("*"))
        return save(self, path)

    monkeypatch.setattr(release_module.Release, "save", checked_save)
    result = _run(lm, out)
    assert seen == [[(EVENT, 1)]]
    assert _entries(out) == [(EVENT, 1)] and result.release.noise_multiplier == EVENT.noise_multiplier
    sidecar = json.loads(GradmmPaths(out).sidecar.read_text())
    assert [entry["event"] for entry in sidecar["ledger"]] == [EVENT.to_dict()]
    _run(lm, out, resume=True)  # the reused release is not accounted again
    assert _entries(out) == [(EVENT, 1)]


def test_every_draw_is_accounted_even_one_that_died_before_its_release_was_saved(lm, tmp_path, monkeypatch):
    """A redraw always appends (over-counting a lost draw is safe; deduplicating it would also let a saved,
    published and deleted release be redrawn uncounted), and reusing the saved release appends nothing."""
    out = tmp_path / "synth.jsonl"

    def die(*args, **kwargs):
        raise Crash

    monkeypatch.setattr(release_module, "add_gaussian_noise", die)
    with pytest.raises(Crash):
        _run(lm, out)
    assert _entries(out) == [(EVENT, 1)] and not GradmmPaths(out).release.exists() and not out.exists()
    monkeypatch.undo()
    _run(lm, out, resume=True)
    assert _entries(out) == [(EVENT, 1), (EVENT, 1)] and GradmmPaths(out).release.exists()
    sidecar = json.loads(GradmmPaths(out).sidecar.read_text())  # the published ε covers both draws
    assert len(sidecar["ledger"]) == 2
    assert sidecar["epsilon_accounted"] == pytest.approx(Ledger.load(GradmmPaths(out).ledger).epsilon(1e-5))
    assert sidecar["epsilon_accounted"] > sidecar["epsilon_target"]
    _run(lm, out, resume=True)  # reuses the saved release: no new entry
    assert _entries(out) == [(EVENT, 1), (EVENT, 1)]


def test_a_release_saved_without_a_ledger_gets_one_on_resume(lm, tmp_path):
    out = tmp_path / "synth.jsonl"
    _run(lm, out)
    GradmmPaths(out).ledger.unlink()  # as an older privlm left it
    _run(lm, out, resume=True)
    assert _entries(out) == [(EVENT, 1)]
