"""``--describe``: a public description of user data, from which generation methods build their instruction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.experiments.config import parse_config
from privlm.resources.datasets import load_dataset
from privlm.resources.labels import as_labels, with_description
from privlm.resources.verbalizers import (
    GENERIC_INSTRUCTION,
    description_instruction,
    generic_verbalizer,
    undescribed,
)


def test_description_becomes_each_class_instruction() -> None:
    verbalizer = generic_verbalizer(("negative", "positive"), description="{label_name} movie review sentence.")
    assert verbalizer.instructions(("negative", "positive")) == [
        "Write one short negative movie review sentence.",
        "Write one short positive movie review sentence.",
    ]
    assert not undescribed(verbalizer)
    assert undescribed(generic_verbalizer(("negative", "positive")))


@pytest.mark.parametrize(
    ("description", "fragment"),
    [("   ", "is empty"), ("movie review sentence", "must name the class"), ("{label} review", "unknown field")],
)
def test_bad_descriptions_are_refused(description: str, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        description_instruction(description)


def test_user_file_takes_the_description_and_builtins_refuse_it(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}", "label": i % 2}) + "\n" for i in range(6)))
    labels = with_description(as_labels("negative,positive"), "{label_name} note")
    data = load_dataset(f"jsonl:{path}", labels=labels)
    assert data.verbalizer.instruction == "Write one short {label_name} note."
    assert load_dataset(f"jsonl:{path}", labels=as_labels("negative,positive")).verbalizer.instruction == (
        GENERIC_INSTRUCTION
    )
    with pytest.raises(UserError, match="--describe is for user data"):
        load_dataset("rotten-tomatoes", labels=with_description(as_labels("negative,positive"), "{label_name} x"))
    with pytest.raises(UserError, match="needs the public classes"):
        with_description(None, "{label_name} note")


def test_experiment_key_describe_and_hash_without_it() -> None:
    base = {
        "model": "tiny-llama",
        "dataset": "jsonl:x.jsonl",
        "labels": ["negative", "positive"],
        "pool_per_class": 2,
        "n_per_class": [1],
        "seeds": [0],
        "methods": {"random": {}},
    }
    plain = parse_config(dict(base), "c.toml")
    described = parse_config({**base, "describe": "{label_name} note"}, "c.toml")
    assert described.labels.description == "{label_name} note"
    assert "description" not in plain.to_dict()["labels"]  # configurations without it keep their hashes
    assert plain.hash != described.hash


def test_data_card_warns_without_a_description(tmp_path: Path, capsys) -> None:
    from privlm.cli import main

    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}", "label": i % 2}) + "\n" for i in range(6)))
    cards = []
    for extra in ([], ["--describe", "{label_name} note"]):
        with pytest.raises(SystemExit) as stop:
            main(["data", "show", f"jsonl:{path}", "--labels", "negative,positive", "--json", *extra])
            raise SystemExit(0)
        assert stop.value.code == 0
        cards.append(json.loads(capsys.readouterr().out))
    assert "no --describe" in cards[0]["description_warning"]
    assert cards[1]["description_warning"] is None
    assert cards[1]["generation_instruction"] == "Write one short {label_name} note."
