"""``privlm synth --method dp-head-pool``: a tiny run's set, sidecar, ledger and card; a resume that reuses the one
labeller (no second draw, the same set); other settings on resume refused; bad input exits 2 before anything is
written."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from cli_helpers import run

import privlm.resources.models as models
from privlm.privacy.ledger import Ledger
from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.dp_head_pool.labeller import LabellerConfig

ROWS = [
    ("a warm and funny story", "pos"),
    ("slow, dull and far too long", "neg"),
    ("I loved every minute of it", "pos"),
    ("one of the worst films of the year", "neg"),
    ("a delight from start to finish", "pos"),
    ("the acting is wooden", "neg"),
    ("moving and beautiful", "pos"),
    ("boring and clumsy", "neg"),
]


@pytest.fixture
def tiny_labeller(monkeypatch):
    """The tiny model and labeller noise of ``tests/synthesis/test_dp_head_pool.py``: on a tiny random model most
    noise draws give every candidate one class (its hidden states share one large direction); this model (seed 4,
    float64) with the labeller's DP-SGD seeded 0 gives both, so the draw has something to choose. The seed makes
    the run's noise reproducible, so its ledger says ``private_release: false`` and the card must warn of it."""
    made = LabellerConfig.train_config
    monkeypatch.setattr(LabellerConfig, "train_config", lambda self, *a: replace(made(self, *a), seed=0))
    monkeypatch.setattr(
        models, "load_model", lambda name, **kwargs: build_tiny_model("tiny-llama", seed=4, dtype=torch.float64)
    )


def _args(data: str, out: Path, *extra: str) -> list[str]:
    return [
        "synth",
        "--model",
        "tiny-llama",
        "--labels",
        "neg=bad,pos=great",
        "--template",
        "{text} It was",
        "--describe",
        "{label_name} movie review sentences",
        "--method",
        "dp-head-pool",
        "--per-class",
        "2",
        "--oversample",
        "6",
        "--epochs",
        "5",
        "--batch-size",
        "4",
        "--train",
        data,
        "--out",
        str(out),
        "--delta",
        "1e-5",
        "--json",
        *extra,
    ]


@pytest.fixture
def data(tmp_path: Path) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in ROWS))
    return str(path)


def test_a_run_states_its_labellers_epsilon_and_a_resume_reuses_it(
    data: str, tmp_path: Path, capsys, tiny_labeller
) -> None:
    out = tmp_path / "set.jsonl"
    code, stdout, err = run(_args(data, out, "--epsilon", "30"), capsys)
    assert code == 0, err
    summary = json.loads(stdout)
    privacy = summary["privacy"]
    assert privacy == json.loads(out.with_suffix(".privacy.json").read_text())
    assert privacy["epsilon"] == 30.0 >= privacy["epsilon_accounted"] > 0 and privacy["delta"] == 1e-5
    ledger_file = tmp_path / privacy["ledger_file"]
    assert ledger_file.is_relative_to(tmp_path / "set.jsonl.dphead")  # the run's own folder
    ledger = Ledger.load(ledger_file)
    assert ledger.epsilon(1e-5) == privacy["epsilon_accounted"] and privacy["labeller"]["epochs"] == 5.0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == summary["rows"] and sorted(r["label"] for r in rows) == [0, 0, 1, 1]
    assert all(r["method"] == "dp-head-pool" and r["epsilon_spent"] == 30.0 for r in rows)
    assert not {r["text"] for r in rows} & {t for t, _ in ROWS}  # public candidates, never a private row
    card = Path(summary["card"]).read_text()
    assert "(ε = 30, δ = 1e-05)-DP" in card and not ledger.private_release and "seeded" in card  # the test's seed
    assert "size N is public" in card  # DP-SGD: its ledger states q = B/N

    written = ledger_file.read_bytes()
    assert run(_args(data, out, "--epsilon", "30"), capsys)[0] == 2  # the folder holds a run: --resume or remove it
    poisoned = [(f"POISON {t[::-1]}", "neg" if y == "pos" else "pos") for t, y in ROWS]
    Path(data).write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in poisoned))
    code, stdout, err = run(_args(data, out, "--epsilon", "30", "--resume"), capsys)
    assert code == 0, err
    assert json.loads(stdout)["rows"] == rows and ledger_file.read_bytes() == written  # not retrained on them
    code, stdout, err = run([*_args(data, out, "--epsilon", "30", "--resume"), "--per-class", "1"], capsys)
    assert code == 0, err  # another n: a new draw among the candidates from the same labeller (post-processing)
    assert len(json.loads(stdout)["rows"]) == 2 and ledger_file.read_bytes() == written
    for other, key in ((["--epsilon", "1"], "epsilon"), (["--epsilon", "30", "--seed", "1"], "seed")):
        code, _, err = run(_args(data, out, *other, "--resume"), capsys)  # a second labeller: refused
        assert code == 2 and f"--resume: {key} was" in err
    code, _, err = run([*_args(data, out, "--epsilon", "30", "--resume"), "--epochs", "6"], capsys)
    assert code == 2 and "--resume: labeller was" in err
    assert sorted(p.name for p in (tmp_path / "set.jsonl.dphead").glob("dphead-*")) == [ledger_file.parent.name]
    assert ledger_file.read_bytes() == written


def test_the_console_shows_the_set_beside_its_privacy(data: str, tmp_path: Path, capsys, tiny_labeller) -> None:
    args = [a for a in _args(data, tmp_path / "set.jsonl", "--epsilon", "30") if a != "--json"]
    code, stdout, err = run(args, capsys)
    assert code == 0, err
    assert "(ε = 30, δ = 1e-05)-DP for the whole output (DP-SGD of the head-only labeller: 5 epochs" in " ".join(
        stdout.split()
    )
    packed = "".join(stdout.split())  # rich wraps long paths and cells at the console's width
    assert "publiccandidate" in packed and "set.card.md" in packed


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--no-dp"], "differentially private only"),
        (["--epsilon", "30", "--epochs", "0"], "epochs"),
        (["--epsilon", "30", "--oversample", "0.5"], "oversample"),
        (["--epsilon", "30", "--lora-layers", "1"], "lora"),
        (["--epsilon", "30", "--per-class", "0"], "--per-class must be >= 1"),
    ],
)
def test_bad_input_exits_2_naming_the_value(data: str, tmp_path: Path, capsys, flags, fragment) -> None:
    args = _args(data, tmp_path / "set.jsonl", *flags)
    if "--no-dp" in flags:
        args.remove("--delta")
        args.remove("1e-5")
    code, _, err = run(args, capsys)
    assert code == 2 and fragment in err
    assert not list(tmp_path.glob("set.jsonl*"))  # nothing written
