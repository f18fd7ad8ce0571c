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
