"""Hub datasets: a clear error without ``datasets`` or offline; conversion checked with a stand-in module."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from collections.abc import Callable

import pytest
from huggingface_hub import constants

from privlm.errors import UserError
from privlm.resources.datasets import load_dataset


class Table:
    def __init__(self, columns: dict[str, list], features: dict[str, object]) -> None:
        self.columns, self.features, self.column_names = columns, features, list(columns)

    def __getitem__(self, column: str) -> list:
        return self.columns[column]


def install_fake_datasets(monkeypatch: pytest.MonkeyPatch, load: Callable[[str, str], Table]) -> None:
    module = types.ModuleType("datasets")
    module.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    module.load_dataset = load
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_without_the_datasets_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(UserError, match=r"cannot load Hugging Face dataset 'x/y': the `datasets` package is not"):
        load_dataset("hf:x/y")


def test_hub_error_becomes_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def offline(name: str, split: str) -> Table:
        raise ConnectionError("Couldn't reach the Hugging Face Hub")

    install_fake_datasets(monkeypatch, offline)
    with pytest.raises(UserError, match=r"cannot load Hugging Face dataset 'x/y': Couldn't reach"):
        load_dataset("hf:x/y")


def test_unreachable_hub_fails_before_asking_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run(name: str, split: str) -> Table:
        raise AssertionError("datasets.load_dataset must not be called offline")

    install_fake_datasets(monkeypatch, must_not_run)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(UserError, match=r"'x/y': the hub is unreachable \(offline\)"):
        load_dataset("hf:x/y")


def test_class_label_names_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def load(name: str, split: str) -> Table:
        calls.append((name, split))
        label = types.SimpleNamespace(names=["neg", "pos", "mixed"])
        return Table({"text": [f"t{i}" for i in range(30)], "label": [i % 3 for i in range(30)]}, {"label": label})

    install_fake_datasets(monkeypatch, load)
    data = load_dataset("hf:owner/sst", split="test")
    assert calls == [("owner/sst", "train")]
    assert data.label_names == ("neg", "pos", "mixed") and len(data) == 3
    assert data.verbalizer.label_words == ("neg", "pos", "mixed")


def test_class_label_names_may_be_reordered_or_renamed(monkeypatch: pytest.MonkeyPatch) -> None:
    label = types.SimpleNamespace(names=["neg", "pos"])
    table = Table({"text": ["a", "b", "c"], "label": [0, 1, 1]}, {"label": label})
    install_fake_datasets(monkeypatch, lambda name, split: table)
    reordered = load_dataset("hf:o/d", labels="pos,neg=awful")
    assert reordered.label_names == ("pos", "neg") and reordered.examples == (("a", 1), ("b", 0), ("c", 0))
    assert reordered.verbalizer.label_words == ("pos", "awful")
    renamed = load_dataset("hf:o/d", labels="bad,good")
    assert renamed.label_names == ("bad", "good") and renamed.examples == (("a", 0), ("b", 1), ("c", 1))
    with pytest.raises(UserError, match=r"--labels gives 3 classes but the data set's ClassLabel has 2"):
        load_dataset("hf:o/d", labels="bad,good,mixed")
    with pytest.raises(UserError, match=r"either list the ClassLabel names"):
        load_dataset("hf:o/d", labels="neg,good")


def test_plain_label_column_and_missing_text(monkeypatch: pytest.MonkeyPatch) -> None:
    table = Table({"text": ["a", "b", "c"], "label": ["no", "yes", "no"]}, {"label": object()})
    install_fake_datasets(monkeypatch, lambda name, split: table)
    with pytest.raises(UserError, match=r"hf:o/d: user data needs its class names as public input.*--labels"):
        load_dataset("hf:o/d")
    assert load_dataset("hf:o/d", labels="yes,no,maybe").label_names == ("yes", "no", "maybe")  # given, not read
    assert load_dataset("hf:o/d", labels="yes,no,maybe").labels == [1, 0, 1]
    table.columns["label"][1] = "hiv_positive"
    with pytest.raises(UserError, match=r"hf:o/d row 2: label is not one of") as err:
        load_dataset("hf:o/d", labels="no,yes")
    assert "hiv_positive" not in str(err.value)
    table = Table({"sentence": ["a"], "label": [0]}, {"label": object()})
    install_fake_datasets(monkeypatch, lambda name, split: table)
    with pytest.raises(UserError, match=r"'o/d' has no 'text' column \(columns: sentence, label\)"):
        load_dataset("hf:o/d")
