"""Resume bound to its data and model, and the write-ahead ledger.

A resume replays the steps after the last checkpoint with the same saved noise: on other rows of the
same size, or on another model, that would release a second value with the same noise (their difference
is noise-free), so it is refused. Every metrics line and checkpoint is written only after the ledger
covering its steps is durable, so a crash at any point leaves nothing released outside the ledger, and
a resume neither loses nor double-counts a step."""

from __future__ import annotations

import json

import pytest
import torch

from privlm.errors import UserError
from privlm.privacy import Ledger
from privlm.resources.tiny import build_tiny_model
from privlm.training import checkpoint as ckpt
from privlm.training.data import TaskData, encode, make_collate
from privlm.training.fingerprint import canonical_bytes, data_fingerprint, model_fingerprint
from privlm.training.loop import TrainConfig, prepare, train_loop
from privlm.training.run import set_up, with_lora

TEXTS = tuple(f"text {i}: " + "the film was great " * (1 + i % 3) for i in range(12))
OTHER = TEXTS[:5] + ("text 5: the film was dull and slow",) + TEXTS[6:]  # same size, one row differs
# q = 4/12: 3 steps per epoch, 6 steps; a checkpoint every 2 steps, a metrics line every step
CONFIG = TrainConfig(task="lm", noise_multiplier=1.0, batch_size=4, epochs=2, seed=0, checkpoint_every=2, log_every=1)


class Crash(RuntimeError):
    """The simulated kill."""


def _run(texts=TEXTS, model_seed=0, config=CONFIG):
    model, tokenizer = build_tiny_model("tiny-llama", seed=model_seed)
    model.train()
    rows = encode(TaskData("lm", texts, (), None), tokenizer, max_length=16)
    return prepare(model, rows, make_collate(tokenizer), config)


def _metrics_steps(run_dir) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _covered(run_dir) -> int:
    return sum(entry.count for entry in Ledger.load(run_dir / "privacy.json"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("full") / "run"
    run = _run()
    result = train_loop(run, run_dir)
    assert result.steps == 6
    weights = {n: p.detach().clone() for n, p in run.module.named_parameters()}
    return run_dir, weights


@pytest.fixture
def crashed(tmp_path, killed_after_step):
    """A run killed right after the metrics line of step 3 (last checkpoint: step 2)."""
    run_dir = tmp_path / "run"
    with killed_after_step(3):
        train_loop(_run(), run_dir)
    return run_dir


def test_a_crash_after_a_metrics_write_leaves_every_logged_step_in_the_ledger(crashed):
    assert _metrics_steps(crashed) == [1, 2, 3]
    assert _covered(crashed) >= max(_metrics_steps(crashed))  # write-ahead: the ledger covers step 3 already
    (checkpoint,) = ckpt.checkpoints(crashed)
    assert checkpoint.name == "checkpoint-00000002"
    assert sum(e.count for e in Ledger.load(checkpoint / "privacy.json")) == 2  # exactly its weights' steps


@pytest.mark.parametrize("at_step", [1, 2, 4, 5, 6])
def test_the_ledger_covers_every_metrics_line_whenever_the_run_dies(tmp_path, killed_after_step, at_step):
    run_dir = tmp_path / "run"
    with killed_after_step(at_step):
        train_loop(_run(), run_dir)
    assert _metrics_steps(run_dir)[-1] == at_step
    assert _covered(run_dir) >= at_step


def test_same_data_resumes_to_the_uninterrupted_run_counting_every_step_once(crashed, uninterrupted):
    full_dir, full_weights = uninterrupted
    run = _run()
    identity = Ledger.load(crashed / "privacy.json").run
    result = train_loop(run, crashed, resume=True)
    assert result.resumed_from == 2 and result.steps == 6
    for name, p in run.module.named_parameters():
        assert torch.equal(p, full_weights[name]), name
    ledger, full = Ledger.load(crashed / "privacy.json"), Ledger.load(full_dir / "privacy.json")
    assert ledger.entries == full.entries  # replayed step 3 not recounted
    assert ledger.run == identity and full.run not in (
        None,
        identity,
    )  # the run keeps its identity; another has its own
    assert [e.label for e in ledger] == [f"steps {i}-{i}" for i in range(1, 7)]
    assert _metrics_steps(crashed) == [1, 2, 3, 4, 5, 6]
    assert result.epsilon == pytest.approx(ledger.epsilon(1e-5), rel=1e-9)


def test_a_crash_between_the_ledger_and_its_checkpoint_is_resumed_without_double_counting(
    tmp_path, uninterrupted, monkeypatch
):
    config = TrainConfig(**{**CONFIG.__dict__, "log_every": 100})  # metrics at the last step only
    run_dir = tmp_path / "run"
    save = ckpt.save_checkpoint

    def save_or_crash(run_dir, step, *args, **kwargs):
        if step == 4:
            raise Crash("killed before the checkpoint of step 4")
        return save(run_dir, step, *args, **kwargs)

    monkeypatch.setattr(ckpt, "save_checkpoint", save_or_crash)
    with pytest.raises(Crash):
        train_loop(_run(config=config), run_dir)
    monkeypatch.undo()
    assert _covered(run_dir) == 4 and [p.name for p in ckpt.checkpoints(run_dir)] == ["checkpoint-00000002"]
    run = _run(config=config)
    result = train_loop(run, run_dir, resume=True)
    assert result.resumed_from == 2
    ledger = Ledger.load(run_dir / "privacy.json")
    assert [e.label for e in ledger] == ["steps 1-2", "steps 3-4", "steps 5-6"]
    for name, p in run.module.named_parameters():
        assert torch.equal(p, uninterrupted[1][name]), name


def test_a_checkpoint_ledger_never_covers_steps_beyond_its_weights(tmp_path, monkeypatch, killed_after_step):
    """Resumed with another --checkpoint-every (a resume-insensitive setting), a checkpoint can fall inside
    the steps the ledger already covers: its own ledger still holds exactly its steps."""
    run_dir = tmp_path / "run"
    with killed_after_step(5):
        train_loop(_run(config=TrainConfig(**{**CONFIG.__dict__, "checkpoint_every": 4})), run_dir)
    assert _covered(run_dir) == 5
    seen = []
    save = ckpt.save_checkpoint

    def record_ledger(run_dir, step, weights, optimizer_state, rng, ledger, meta):
        seen.append((step, sum(e.count for e in ledger)))
        return save(run_dir, step, weights, optimizer_state, rng, ledger, meta)

    monkeypatch.setattr(ckpt, "save_checkpoint", record_ledger)
    run = _run(config=TrainConfig(**{**CONFIG.__dict__, "checkpoint_every": 1}))
    train_loop(run, run_dir, resume=True)
    assert seen == [(5, 5), (6, 6)]
    assert _covered(run_dir) == 6


def test_resume_with_other_data_of_the_same_size_is_refused(crashed):
    before = (crashed / "privacy.json").read_text()
    run = _run(texts=OTHER)
    with pytest.raises(UserError, match="other training data") as err:
        train_loop(run, crashed, resume=True)
    saved = json.loads((ckpt.checkpoints(crashed)[-1] / "meta.json").read_text())["fingerprints"]
    assert saved["data"] not in str(err.value) and saved["model"] not in str(err.value)  # names which, never the value
    assert (crashed / "privacy.json").read_text() == before and _metrics_steps(crashed) == [1, 2, 3]


def test_a_run_folder_holding_another_runs_ledger_is_not_resumed(crashed):
    """The same events under another run's identity (a ledger copied from a run made again elsewhere): the
    checkpoint was written by this folder's run, so the folder is inconsistent."""
    ledger = Ledger.load(crashed / "privacy.json")
    other = Ledger(ledger.entries, ledger.private_release, run="f" * 16)
    (crashed / "privacy.json").write_text(json.dumps(other.to_dict()))
    with pytest.raises(UserError, match="inconsistent"):
        train_loop(_run(), crashed, resume=True)


def test_resume_with_reordered_rows_is_refused(crashed):
    with pytest.raises(UserError, match="other training data"):
        train_loop(_run(texts=TEXTS[1:] + TEXTS[:1]), crashed, resume=True)


def test_resume_with_another_model_is_refused(crashed):
    with pytest.raises(UserError, match="another model"):
        train_loop(_run(model_seed=1), crashed, resume=True)


def test_a_checkpoint_without_fingerprints_is_not_resumed(crashed):
    (checkpoint,) = ckpt.checkpoints(crashed)
    meta = json.loads((checkpoint / "meta.json").read_text())
    del meta["fingerprints"]
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="no data and model fingerprints"):
        train_loop(_run(), crashed, resume=True)


def test_the_data_fingerprint_stays_out_of_the_released_files(uninterrupted):
    run_dir, _ = uninterrupted
    run = _run()
    secret = data_fingerprint(run.rows, run.collate)
    for name in ("privacy.json", "metrics.jsonl"):
        assert secret not in (run_dir / name).read_text()


def test_data_fingerprint_is_of_the_rows_in_order():
    _, tokenizer = build_tiny_model("tiny-llama", seed=0)
    rows = encode(TaskData("lm", TEXTS, (), None), tokenizer, max_length=16)
    same = encode(TaskData("lm", TEXTS, (), None), tokenizer, max_length=16)
    assert data_fingerprint(rows) == data_fingerprint(same)
    assert data_fingerprint(rows) != data_fingerprint(rows[::-1])
    assert data_fingerprint(rows) != data_fingerprint(rows[:-1])
    assert data_fingerprint(rows) != data_fingerprint(encode(TaskData("lm", TEXTS, (), None), tokenizer, max_length=8))
    # canonical bytes are injective across types and boundaries
    assert canonical_bytes(["ab", "c"]) != canonical_bytes(["a", "bc"])
    assert canonical_bytes([1]) != canonical_bytes(["1"]) != canonical_bytes([1.0])
    assert canonical_bytes(torch.tensor([1, 2])) != canonical_bytes(torch.tensor([1, 2], dtype=torch.int32))


def test_rows_without_a_canonical_form_are_fingerprinted_through_collate():
    class Opaque:
        def __init__(self, ids):
            self.ids = ids

    def collate(rows):
        return {"input_ids": torch.tensor([r.ids for r in rows])}

    assert data_fingerprint([Opaque([1, 2])], collate) == data_fingerprint([Opaque([1, 2])], collate)
    assert data_fingerprint([Opaque([1, 2])], collate) != data_fingerprint([Opaque([1, 3])], collate)
    with pytest.raises(TypeError):
        data_fingerprint([Opaque([1, 2])])


def test_model_fingerprint_covers_weights_config_and_lora_init_but_not_the_load_path():
    a, _ = build_tiny_model("tiny-llama", seed=0)
    b, _ = build_tiny_model("tiny-llama", seed=0)
    assert model_fingerprint(a) == model_fingerprint(b)
    assert model_fingerprint(a) != model_fingerprint(build_tiny_model("tiny-llama", seed=1)[0])
    b.config._name_or_path = "/somewhere/else"
    assert model_fingerprint(a) == model_fingerprint(b)
    b.config.rope_theta = 1234.0
    assert model_fingerprint(a) != model_fingerprint(b)
    lora = [with_lora(build_tiny_model("tiny-llama", seed=0)[0], 4, seed=s) for s in (0, 0, 1)]
    assert model_fingerprint(lora[0]) == model_fingerprint(lora[1]) != model_fingerprint(lora[2])
    assert model_fingerprint(lora[0]) != model_fingerprint(
        with_lora(build_tiny_model("tiny-llama", seed=0)[0], 2, seed=0)
    )
    frozen = build_tiny_model("tiny-llama", seed=0)[0]
    frozen.lm_head.requires_grad_(False)
    assert model_fingerprint(frozen) != model_fingerprint(a)  # which parameters train is part of the model


def test_a_lora_run_without_a_seed_rebuilds_the_same_model(tmp_path):
    """The adapters' initial values are fixed public inputs (seed 0 without --seed), so a resumed LoRA run
    without --seed passes the model check; before, they came from the process's random global generator."""
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    config = TrainConfig(task="lm", noise_multiplier=1.0, batch_size=4, lora=4, max_length=16)
    first = set_up("tiny-llama", f"jsonl:{path}", config)
    torch.rand(7)  # whatever the global generator did in between
    second = set_up("tiny-llama", f"jsonl:{path}", config)
    assert model_fingerprint(first.module) == model_fingerprint(second.module)
    assert data_fingerprint(first.run.rows) == data_fingerprint(second.run.rows)
