"""End-to-end GRADMM runs on a tiny model: the wall (poison test), resume after a crash, refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import privlm.randomness as randomness
import privlm.synthesis.gradmm.generate as generate
from privlm.errors import UserError
from privlm.progress import Progress, Task
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.generate import ADMM_STEPS, BATCHES, LABEL_FILTER
from privlm.synthesis.gradmm.pipeline import PRIVATE_PASS, GradmmPaths, run_gradmm
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.gradmm.release import clipped_class_sums

PRIVATE = [
    ("the movie was a delight from start to finish", 1),
    ("slow, dull and far too long", 0),
    ("a warm, funny and moving story with a wonderful cast", 1),
    ("the plot makes no sense and the acting is wooden", 0),
    ("I loved every minute of it and would watch it again", 1),
    ("this is one of the worst films of the year", 0),
]
CONFIG = make_config("demo", length=4, batch=3, outer_steps=2, inner_steps=3, top_k=8, seed=1, oversample=2.0)
PER_CLASS = 3  # 2 batches of 3 candidates per class


@pytest.fixture(scope="module")
def lm():
    model, tokenizer = build_tiny_model("tiny-llama", seed=2)  # a seed whose few-shot labels are mixed
    model.requires_grad_(False)
    return model, tokenizer, build_prompt(tokenizer, " It was ", ["bad", "great"], ["negative", "positive"])


def _run(lm, out: Path, load_private, **kwargs):
    model, tokenizer, prompt = lm
    return run_gradmm(
        model,
        tokenizer,
        prompt,
        load_private,
        out=out,
        per_class=PER_CLASS,
        config=CONFIG,
        dp=True,
        epsilon=4.0,
        delta=1e-5,
        **kwargs,
    )


@pytest.fixture(scope="module")
def reference(lm, tmp_path_factory) -> tuple[Path, bytes]:
    out = tmp_path_factory.mktemp("ref") / "synth.jsonl"
    with pytest.MonkeyPatch.context() as mp:  # a fixed noise seed, so this test file is deterministic
        mp.setattr(randomness.os, "urandom", lambda n: bytes(range(n)))
        result = _run(lm, out, lambda: list(PRIVATE))
    assert len(result.rows) > 0, "the reference run must produce examples for the comparisons to mean anything"
    return out, out.read_bytes()


def test_output_rows_and_sidecar(reference) -> None:
    out, data = reference
    import json

    rows = [json.loads(line) for line in data.decode().splitlines()]
    assert {r["label_name"] for r in rows} == {"negative", "positive"}
    assert all(set(r) == {"text", "label", "label_name", "match_loss", "dp"} and r["dp"] for r in rows)
    privacy = json.loads((out.parent / "synth.privacy.json").read_text())
    assert (
        privacy["epsilon_target"] == 4.0
        and 4.0 <= privacy["epsilon"] < 4.01
        and privacy["delta"] == 1e-5
        and privacy["clip"] == CONFIG.clip
    )
    assert len(privacy["release_sha256"]) == 64
    assert privacy["examples_per_class_to_match_noise"] == pytest.approx(privacy["noise_norm_per_class"] / CONFIG.clip)


def test_poisoning_private_data_after_the_release_leaves_output_bit_identical(lm, reference, tmp_path) -> None:
    ref_out, ref_bytes = reference
    poisoned = [("POISON " * 5 + text[::-1], 1 - label) for text, label in PRIVATE]
    model, tokenizer, prompt = lm
    before = clipped_class_sums(model, tokenizer, PRIVATE, prompt, clip=None, max_tokens=64)
    after = clipped_class_sums(model, tokenizer, poisoned, prompt, clip=None, max_tokens=64)
    assert not torch.allclose(before, after)  # the poison would change a freshly drawn release
    out = tmp_path / "synth.jsonl"
    _reuse_release(ref_out, out)
    calls = []
    result = _run(lm, out, lambda: calls.append(1) or poisoned, resume=True)
    assert result.reused_release and calls == []
    assert out.read_bytes() == ref_bytes


def _reuse_release(ref_out: Path, out: Path) -> None:
    """Start ``out``'s run from the reference run's release only (no finished batches carried over)."""
    GradmmPaths(out).workdir.mkdir()
    for name in ("release.pt", "run.json"):
        shutil.copy(GradmmPaths(ref_out).workdir / name, GradmmPaths(out).workdir / name)


class Crash(Exception):
    pass


def test_resume_after_crash_between_batches(lm, reference, tmp_path, monkeypatch, recorded_progress) -> None:
    real = generate.generate_batch
    done = []

    def crashing(*args, **kwargs):
        if len(done) == 2:
            raise Crash
        done.append(1)
        return real(*args, **kwargs)

    out = tmp_path / "synth.jsonl"
    _reuse_release(reference[0], out)  # same release as the uninterrupted run (noise is never reproducible)
    monkeypatch.setattr(generate, "generate_batch", crashing)
    with pytest.raises(Crash):
        _run(lm, out, lambda: pytest.fail("the release must be reused"), resume=True)
    assert not out.exists() and not GradmmPaths(out).sidecar.exists()
    assert len(list(GradmmPaths(out).batches.glob("*.json"))) == 2
    monkeypatch.setattr(generate, "generate_batch", real)
    _run(lm, out, lambda: pytest.fail("the release must be reused"), resume=True, progress=recorded_progress)
    assert out.read_bytes() == reference[1]
    # public counts only (the release is reused: no private pass): the 4 batches (2 found done), the ADMM steps of
    # one batch, the label filter over every candidate (2 classes x 2 batches of 3)
    assert recorded_progress.opened == [
        (BATCHES, 4, False),
        (ADMM_STEPS, 2 * 3, False),
        (LABEL_FILTER, 2 * 2 * 3, False),
    ]
    assert recorded_progress.advanced_by == {BATCHES: 4, LABEL_FILTER: 2 * 2 * 3}


def test_a_drawn_release_reads_the_private_examples_inside_a_private_task(lm, tmp_path, recorded_progress) -> None:
    """The private pass is a private task, open while the examples are read; a run on more private examples
    shows exactly the same public events (batches, ADMM steps, label filter): no public count depends on N."""
    read = []

    def loader(rows, shown):
        def load_private():
            assert shown.opened == [(PRIVATE_PASS, None, True)] and shown.finished == []  # read inside it
            read.append(len(rows))
            return rows

        return load_private

    _run(lm, tmp_path / "synth.jsonl", loader(list(PRIVATE), recorded_progress), progress=recorded_progress)
    assert [entry for entry in recorded_progress.opened if entry[2]] == [(PRIVATE_PASS, None, True)]
    more = type(recorded_progress)()
    larger = [*PRIVATE, ("an unexpected delight", 1), ("a chore to sit through", 0), ("dull", 0)]
    _run(lm, tmp_path / "more.jsonl", loader(larger, more), progress=more)
    assert read == [6, 9] and more.public_view() == recorded_progress.public_view()
    calls, counted = more.public_view()
    assert counted == {BATCHES: 4, LABEL_FILTER: 2 * 2 * 3}
    assert [value for task, call, value in calls if task == ADMM_STEPS and call == "update"][:7] == [
        (None, step) for step in range(7)
    ]  # each batch's count set back to 0, then its 2 x 3 steps


class _CrashAtStep(Progress):
    """Raises :class:`Crash` when the ``at``-th ADMM step is shown."""

    def __init__(self, at: int) -> None:
        self.at, self.steps = at, 0

    def task(
        self, description: str, total: float | None = None, private: bool = False, transient: bool = False
    ) -> Task:
        shown = self

        class _Steps(Task):
            def update(self, *, description=None, completed=None, total=None) -> None:
                if completed:  # a step done (0: the count set back at a new batch)
                    shown.steps += 1
                    if shown.steps == shown.at:
                        raise Crash

        return _Steps() if description == ADMM_STEPS else Task()


def test_resume_after_crash_mid_batch(lm, reference, tmp_path) -> None:
    out = tmp_path / "synth.jsonl"
    _reuse_release(reference[0], out)
    with pytest.raises(Crash):  # the 10th step is inside the 2nd batch (6 ADMM steps per batch)
        _run(lm, out, lambda: pytest.fail("the release must be reused"), resume=True, progress=_CrashAtStep(10))
    assert not out.exists() and len(list(GradmmPaths(out).batches.glob("*.json"))) == 1
    _run(lm, out, lambda: pytest.fail("the release must be reused"), resume=True)
    assert out.read_bytes() == reference[1]


def test_existing_release_without_resume_is_refused(lm, reference, tmp_path) -> None:
    out = tmp_path / "synth.jsonl"
    shutil.copytree(GradmmPaths(reference[0]).workdir, GradmmPaths(out).workdir)
    with pytest.raises(UserError, match="--resume"):
        _run(lm, out, lambda: list(PRIVATE))


def test_resume_with_other_settings_is_refused(lm, reference, tmp_path) -> None:
    out = tmp_path / "synth.jsonl"
    shutil.copytree(GradmmPaths(reference[0]).workdir, GradmmPaths(out).workdir)
    model, tokenizer, prompt = lm
    with pytest.raises(UserError, match="epsilon"):
        run_gradmm(
            model,
            tokenizer,
            prompt,
            lambda: list(PRIVATE),
            out=out,
            per_class=PER_CLASS,
            config=CONFIG,
            dp=True,
            epsilon=8.0,
            delta=1e-5,
            resume=True,
        )


def test_a_run_saved_before_a_setting_existed_resumes_with_its_default(lm, reference, tmp_path) -> None:
    import json

    out = tmp_path / "synth.jsonl"
    shutil.copytree(GradmmPaths(reference[0]).workdir, GradmmPaths(out).workdir)
    manifest = GradmmPaths(out).manifest
    saved = json.loads(manifest.read_text())
    del saved["config"]["label_filter"]  # as written before label_filter was added (its default: True)
    manifest.write_text(json.dumps(saved))
    _run(lm, out, lambda: pytest.fail("the release must be reused"), resume=True)
    assert out.read_bytes() == reference[1]
    saved["config"]["label_filter"] = False  # an explicit other value is still refused
    manifest.write_text(json.dumps(saved))
    with pytest.raises(UserError, match="config"):
        _run(lm, out, lambda: pytest.fail("the release must be reused"), resume=True)
