"""Dataset registry: names, the Dataset object, verbalizers of the built-ins."""

from __future__ import annotations

import pytest

from privlm.errors import UserError
from privlm.resources.datasets import BUILTIN, DEFAULT_DATASET, dataset_names, load_dataset


@pytest.mark.parametrize(
    ("name", "size", "classes"),
    [("rotten-tomatoes", 10_568, 2), ("tweets", 4_196, 2), ("tweets-3class", 38_158, 3), ("bbc-news", 2_225, 5)],
)
def test_builtin_sizes_and_verbalizers(name: str, size: int, classes: int) -> None:
    data = load_dataset(name)
    assert len(data) == size and data.num_classes == classes and sum(data.class_counts().values()) == size
    assert len(data.verbalizer.label_words) == classes
    assert len(set(data.verbalizer.label_words)) == classes
    assert data.split is None and data.texts[0] == data[0][0] and data.labels[0] == data[0][1]


def test_sentiment_verbalizers_follow_design() -> None:
    rotten = load_dataset(DEFAULT_DATASET)
    assert rotten.label_names == ("negative", "positive")
    assert rotten.verbalizer.completion("A fine film.", 1) == "A fine film. It was great"
    assert rotten.verbalizer.label_words == ("bad", "great")
    tweets = load_dataset("tweets")
    assert "joy or sadness" in tweets.verbalizer.template and tweets.verbalizer.label_words == ("sadness", "joy")


def test_unknown_dataset_lists_known_names() -> None:
    with pytest.raises(UserError) as err:
        load_dataset("rotten-tomato")
    assert "unknown dataset 'rotten-tomato'" in str(err.value)
    for known in [*BUILTIN, "jsonl:PATH", "csv:PATH", "hf:NAME"]:
        assert known in str(err.value)
    with pytest.raises(UserError, match="unknown dataset 'jsonl:'"):
        load_dataset("jsonl:")
    assert dataset_names()[:4] == sorted(BUILTIN)


def test_a_data_spec_reads_each_data_set_once(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from privlm.resources import datasets
    from privlm.resources.datasets import DataSpec

    reads = []
    reader, verbalizer = BUILTIN[DEFAULT_DATASET]
    monkeypatch.setitem(BUILTIN, DEFAULT_DATASET, (lambda: reads.append(DEFAULT_DATASET) or reader(), verbalizer))
    read_jsonl = datasets.PREFIXES["jsonl:"]
    monkeypatch.setitem(datasets.PREFIXES, "jsonl:", lambda path, spec: reads.append(path) or read_jsonl(path, spec))
    test = tmp_path / "test.jsonl"
    test.write_text(
        "".join(
            json.dumps({"text": f"a review {i}", "label": ["negative", "positive"][i % 2]}) + "\n" for i in range(6)
        )
    )
    whole = load_dataset(DataSpec(data=DEFAULT_DATASET, test=f"jsonl:{test}"), None, seed=3)
    assert reads == [DEFAULT_DATASET, str(test)]  # the built-in once, not once for it and once per split
    train = load_dataset(DEFAULT_DATASET, "train", seed=3)
    validation = load_dataset(DEFAULT_DATASET, "validation", seed=3)
    assert whole.examples == train.examples + validation.examples + tuple(
        load_dataset(f"jsonl:{test}", labels=whole.label_names)
    )
    assert whole.split_sizes == {"train": len(train), "validation": len(validation), "test": 6}
    reads.clear()
    load_dataset(DataSpec(data=f"jsonl:{test}", test=DEFAULT_DATASET), "train", seed=3, labels="negative,positive")
    assert reads == [DEFAULT_DATASET, str(test)]
