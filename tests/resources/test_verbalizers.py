"""Built-in verbalizers: prompts and generation instructions per data set."""

from __future__ import annotations

from privlm.resources.datasets import load_dataset


def test_built_in_data_other_than_movie_reviews_name_their_own_instruction() -> None:
    for name in ("tweets", "bbc-news"):
        dataset = load_dataset(name)
        instructions = dataset.verbalizer.instructions(dataset.label_names)
        assert instructions is not None and len(instructions) == len(dataset.label_names)
        assert not any("movie" in text for text in instructions)
        assert all(word in text for word, text in zip(dataset.verbalizer.label_words, instructions))
    assert load_dataset("rotten-tomatoes").verbalizer.instructions(("negative", "positive")) is None
