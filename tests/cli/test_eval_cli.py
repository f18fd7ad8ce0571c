"""``privlm eval`` end to end on a tiny model and local JSONL files; bad input exits 2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from cli_helpers import exit_code as run

from privlm.resources.datasets import load_dataset

GOOD = ["warm", "funny", "moving", "smart", "honest", "wonderful", "delight", "loved"]
BAD = ["slow", "dull", "wooden", "worst", "terrible", "sad", "tired", "long"]


def write_keyword_rows(path: Path, n: int, seed: int, names: bool) -> None:
    rng = random.Random(seed)
    with path.open("w") as handle:
        for i in range(n):
            label = i % 2
            words = rng.sample(GOOD if label else BAD, 2)
            row = {
                "text": f"the film is {words[0]} and {words[1]}",
                "label": ["bad", "great"][label] if names else label,
            }
            handle.write(json.dumps(row) + "\n")


def test_eval_fine_tunes_and_scores_a_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, train = tmp_path / "data.jsonl", tmp_path / "train.jsonl"
    write_keyword_rows(data, 200, seed=1, names=True)  # public classes, --labels bad,great: bad=0, great=1
    write_keyword_rows(train, 32, seed=2, names=False)
    code = run(
        [
            "eval",
            "--model",
            "tiny-llama",
            "--preset",
            "tiny",
            "--train",
            str(train),
            "--data",
            f"jsonl:{data}",
            "--labels",
            "bad,great",
            "--select-epoch",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert (
        out["n_test"] == len(load_dataset(f"jsonl:{data}", split="test", labels="bad,great")) and out["n_train"] == 32
    )
    assert out["accuracy"] >= 0.85 and out["ci_low"] <= out["accuracy"] <= out["ci_high"]
    assert 1 <= out["best_epoch"] <= out["finetune"]["epochs"]


def test_eval_refuses_bad_input_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, train = tmp_path / "data.jsonl", tmp_path / "train.jsonl"
    write_keyword_rows(data, 40, seed=1, names=True)
    train.write_text('{"text": "fine", "label": 1}\n{"text": "odd", "label": 2}\n')
    base = ["eval", "--model", "tiny-llama", "--preset", "tiny", "--test", f"jsonl:{data}", "--labels", "bad,great"]
    assert run([*base, "--train", str(train)]) == 2
    assert f"{train}:2" in capsys.readouterr().err
    train.write_text('{"text": "fine", "label": 1, "label_name": "bad"}\n')
    assert run([*base, "--train", str(train)]) == 2
    assert "does not match class 1 ('great')" in capsys.readouterr().err
    assert run([*base, "--train", str(tmp_path / "missing.jsonl")]) == 2
    assert "file not found" in capsys.readouterr().err
    assert run([*base, "--train", str(train), "--preset", "huge"]) == 2
    assert "unknown fine-tuning preset 'huge'" in capsys.readouterr().err
    assert run([*base[:-2], "--train", str(train)]) == 2  # user data without --labels
    assert "--labels NAME,NAME,..." in capsys.readouterr().err


def test_eval_generate_fine_tunes_and_scores_completions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows.jsonl"
    rng = random.Random(0)
    with rows.open("w") as handle:
        for i in range(80):
            words = rng.sample(GOOD + BAD, 3)
            prompt = f"review {i}: the film is {' and '.join(words)}"
            handle.write(json.dumps({"prompt": prompt, "completion": words[0]}) + "\n")
    base = ["eval", "--task", "generate", "--model", "tiny-llama", "--preset", "tiny", "--data", f"jsonl:{rows}"]
    assert run([*base, "--epochs", "1", "--max-test", "4", "--max-new-tokens", "4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n"] == 4 and 50 <= summary["n_train"] <= 75  # the per-row 80/10/10 split of 80 rows
    assert all(0 <= summary[k] <= 1 for k in ("rouge1", "rouge2", "rougeL", "exact_match"))
    assert run([*base, "--labels", "bad,great"]) == 2
    assert "--task generate has no classes" in capsys.readouterr().err
