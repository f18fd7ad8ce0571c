"""The experiment TOML's ``labels`` key: public class names of user data, and unchanged hashes without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privlm.errors import UserError
from privlm.experiments.config import load_config, parse_config
from privlm.resources.labels import LabelSpec

ROOT = Path(__file__).resolve().parents[2]
BASE = {"model": "tiny-llama", "pool_per_class": 4, "n_per_class": [2], "seeds": [0], "methods": {"random": {}}}


@pytest.mark.parametrize(
    ("labels", "names", "words"),
    [
        (["negative", "positive"], ("negative", "positive"), ("negative", "positive")),
        (["negative=bad", "positive"], ("negative", "positive"), ("bad", "positive")),
        ({"negative": "bad", "positive": "great"}, ("negative", "positive"), ("bad", "great")),
    ],
)
def test_labels_key_forms(labels, names, words) -> None:
    config = parse_config({**BASE, "dataset": "jsonl:x.jsonl", "labels": labels}, "exp.toml")
    assert isinstance(config.labels, LabelSpec)
    assert config.labels.names == names and config.labels.label_words == words
    assert json.loads(json.dumps(config.to_dict()))["labels"]["names"] == list(names)


def test_user_data_without_labels_is_refused_and_bad_labels_name_the_key() -> None:
    with pytest.raises(UserError, match=r"exp\.toml: dataset 'csv:x\.csv' is user data: give its public class names"):
        parse_config({**BASE, "dataset": "csv:x.csv"}, "exp.toml")
    with pytest.raises(UserError, match=r"exp\.toml: labels: needs at least 2 classes"):
        parse_config({**BASE, "dataset": "jsonl:x.jsonl", "labels": ["only"]}, "exp.toml")
    with pytest.raises(UserError, match=r"exp\.toml: labels: a table must map class names to label words"):
        parse_config({**BASE, "dataset": "jsonl:x.jsonl", "labels": {"a": 1, "b": 2}}, "exp.toml")


def test_a_configuration_without_labels_keeps_its_committed_hash() -> None:
    config = load_config(ROOT / "research" / "synthetic_pool50" / "config.toml")
    assert "labels" not in config.to_dict()
    assert config.hash == json.loads((ROOT / "research" / "synthetic_pool50" / "config.json").read_text())["hash"]
