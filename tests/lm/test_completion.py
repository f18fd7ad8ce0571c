"""Prompt → completion encoding (loss mask, body cut, suffix and completion kept), batches, and greedy decoding
on the tiny models (and a fine-tuned one that must write its completions back)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from privlm.errors import UserError
from privlm.lm.completion import (
    HEADLINE_TEMPLATE,
    collate_completions,
    count_cut,
    encode_completion,
    encode_completions,
    encode_prompt,
    first_line,
    greedy_complete,
    prompt_token_lengths,
    special_prefix,
)
from privlm.lm.prompts import IGNORE_INDEX, pad_token_id
from privlm.resources.completions import CompletionRow
from privlm.resources.tiny import build_tiny_model, tiny_tokenizer

ARTICLE = "The market rose today as shares in technology companies gained after a new budget for schools."
HEADLINE = "Shares gain"


def ids(text: str) -> list[int]:
    return tiny_tokenizer()(text, add_special_tokens=False)["input_ids"]


def test_prompt_is_masked_and_completion_ends_with_eos() -> None:
    tok = tiny_tokenizer()
    enc = encode_completion(tok, ARTICLE, HEADLINE, max_length=128, template=HEADLINE_TEMPLATE)
    context = ids(ARTICLE) + ids("\nHeadline:")
    target = ids(" " + HEADLINE) + [tok.eos_token_id]  # the template's trailing space leads the completion
    assert enc.input_ids == context + target and enc.prompt_cut == 0
    assert enc.labels == [IGNORE_INDEX] * len(context) + target
    assert enc.n_completion_tokens == len(target)
    assert tok.decode(enc.input_ids) == f"{ARTICLE}\nHeadline: {HEADLINE}{tok.eos_token}"


def test_template_without_suffix_and_with_text_before() -> None:
    tok = tiny_tokenizer()
    plain = encode_completion(tok, "a fine film", "great", max_length=64)  # template "{text}": prompt, completion
    assert plain.input_ids == ids("a fine film") + ids("great") + [tok.eos_token_id]
    spaced = encode_completion(tok, "a fine film ", "great", max_length=64)  # the prompt's space moves over
    assert spaced.input_ids == ids("a fine film") + ids(" great") + [tok.eos_token_id]
    wrapped = encode_completion(tok, "a fine film", "great", max_length=64, template="Review: {text}\nVerdict: ")
    assert tok.decode(wrapped.input_ids[: -len(ids(" great")) - 1]) == "Review: a fine film\nVerdict:"
    with pytest.raises(UserError, match="at most once"):
        encode_completion(tok, "a", "b", max_length=64, template="{text} {text}")


@pytest.mark.parametrize("max_length", [20, 27, 33])
def test_long_prompt_body_is_cut_from_its_end_keeping_suffix_and_completion(max_length: int) -> None:
    tok = tiny_tokenizer()
    full = encode_completion(tok, ARTICLE, HEADLINE, max_length=512, template=HEADLINE_TEMPLATE)
    enc = encode_completion(tok, ARTICLE, HEADLINE, max_length=max_length, template=HEADLINE_TEMPLATE)
    body, suffix = ids(ARTICLE), ids("\nHeadline:")
    target = ids(" " + HEADLINE) + [tok.eos_token_id]
    kept = max_length - len(suffix) - len(target)
    assert len(enc.input_ids) == len(enc.labels) == max_length
    assert enc.prompt_cut == len(body) - kept == len(full.input_ids) - max_length > 0
    assert enc.input_ids == body[:kept] + suffix + target  # the beginning of the body, the whole suffix
    assert enc.labels[-len(target) :] == target and enc.labels[: -len(target)] == [IGNORE_INDEX] * (
        max_length - len(target)
    )
    assert tok.decode(enc.input_ids).endswith(f"\nHeadline: {HEADLINE}{tok.eos_token}")


def test_completion_that_leaves_no_room_names_the_row() -> None:
    tok = tiny_tokenizer()
    need = len(ids("\nHeadline:")) + len(ids(" " + HEADLINE)) + 1
    assert encode_completion(tok, ARTICLE, HEADLINE, max_length=need + 1, template=HEADLINE_TEMPLATE).input_ids[-need:]
    with pytest.raises(UserError, match=r"row 4: .*leaves room for 0 prompt tokens"):
        encode_completions(tok, [("a", "b")] * 4 + [(ARTICLE, HEADLINE)], max_length=need, template=HEADLINE_TEMPLATE)
    with pytest.raises(UserError, match="row 0: the completion is empty"):
        encode_completions(tok, [("a", "")], max_length=64)


def test_text_before_the_prompt_is_never_cut_away() -> None:
    tok = tiny_tokenizer()
    template = "Article: {text}\nHeadline: "
    before = len(ids("Article:"))
    fixed = len(ids("\nHeadline:")) + len(ids(" " + HEADLINE)) + 1
    enc = encode_completion(tok, ARTICLE, HEADLINE, max_length=fixed + before + 2, template=template)
    assert tok.decode(enc.input_ids).startswith("Article:")
    with pytest.raises(UserError, match="needs"):
        encode_completion(tok, ARTICLE, HEADLINE, max_length=fixed + before - 1, template=template)


def test_cut_count_and_batch_encoding_of_dataset_rows() -> None:
    tok = tiny_tokenizer()
    rows = [
        CompletionRow(ARTICLE, HEADLINE),
        CompletionRow("Short.", "Tiny"),
        ("Dull.", "Bad film"),
        CompletionRow(ARTICLE + " " + ARTICLE, "Twice"),
    ]
    encoded = encode_completions(tok, rows, max_length=30, template=HEADLINE_TEMPLATE)
    assert [e.prompt_cut > 0 for e in encoded] == [True, False, False, True]
    assert count_cut(encoded) == 2 and count_cut(encode_completions(tok, rows, max_length=128)) == 0
    assert encoded[2] == encode_completion(tok, "Dull.", "Bad film", max_length=30, template=HEADLINE_TEMPLATE)


def test_collate_right_pads_with_masked_labels() -> None:
    tok = tiny_tokenizer()
    encoded = encode_completions(
        tok, [(ARTICLE, HEADLINE), ("Dull.", "Bad")], max_length=64, template=HEADLINE_TEMPLATE
    )
    pad = pad_token_id(tok)
    batch = collate_completions(encoded, pad)
    longest = max(len(e.input_ids) for e in encoded)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert all(t.shape == (2, longest) and t.dtype == torch.long for t in batch.values())
    for row, e in enumerate(encoded):
        n = len(e.input_ids)
        assert batch["input_ids"][row, :n].tolist() == e.input_ids and batch["labels"][row, :n].tolist() == e.labels
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (longest - n)
        assert (batch["input_ids"][row, n:] == pad).all() and (batch["labels"][row, n:] == IGNORE_INDEX).all()
    # the tiny tokenizer's pad id is its eos id: the eos target stays a label, the padding does not
    assert pad == tok.eos_token_id and (batch["labels"][1] == tok.eos_token_id).sum() == 1
    fixed = collate_completions(encoded, pad, width=longest + 5, rows=4)
    assert fixed["input_ids"].shape == (4, longest + 5) and (fixed["labels"][2:] == IGNORE_INDEX).all()


def test_tiny_and_smollm2_style_tokenizers_add_no_bos() -> None:
    tok = tiny_tokenizer()
    assert special_prefix(tok) == [] and tok("It was")["input_ids"] == ids("It was")


def test_a_bos_adding_tokenizer_keeps_its_bos_first_even_after_a_cut() -> None:
    class BosTokenizer:  # a Llama-style tokenizer: BOS (id 500) before every text when special tokens are added
        eos_token_id = 0

        def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
            return {"input_ids": ([500] if add_special_tokens else []) + ids(text)}

    tok = BosTokenizer()
    assert special_prefix(tok) == [500]
    enc = encode_completion(tok, ARTICLE, HEADLINE, max_length=24, template=HEADLINE_TEMPLATE)
    assert enc.input_ids[0] == 500 and 500 not in enc.input_ids[1:] and len(enc.input_ids) == 24 and enc.prompt_cut > 0
    assert encode_prompt(tok, ARTICLE, max_length=12, template=HEADLINE_TEMPLATE)[0][0] == 500
    assert prompt_token_lengths(tok, [ARTICLE], HEADLINE_TEMPLATE) == [1 + len(ids(ARTICLE)) + len(ids("\nHeadline:"))]


def test_encode_prompt_is_the_context_of_encode_completion() -> None:
    tok = tiny_tokenizer()
    enc = encode_completion(tok, ARTICLE, HEADLINE, max_length=30, template=HEADLINE_TEMPLATE)
    context = [i for i, label in zip(enc.input_ids, enc.labels) if label == IGNORE_INDEX]
    assert encode_prompt(tok, ARTICLE, max_length=len(context), template=HEADLINE_TEMPLATE) == (context, enc.prompt_cut)


def test_first_line() -> None:
    assert first_line("  \n Shares gain \nmore") == "Shares gain" and first_line(" \n ") == ""


PROMPTS = ["The market rose today.", "The team won the match after a late goal in the second half.", "Dull.", ARTICLE]


@pytest.mark.parametrize(("name", "distinct"), [("tiny-llama", 1), ("tiny-gpt2", 4)])
def test_greedy_complete_returns_one_string_per_prompt_deterministically(name: str, distinct: int) -> None:
    model, tok = build_tiny_model(name, seed=2)  # the random tiny Llama writes the same for every prompt
    model.train()
    kwargs = {"max_new_tokens": 6, "max_length": 40, "template": HEADLINE_TEMPLATE}
    first = greedy_complete(model, tok, PROMPTS, batch_size=3, **kwargs)
    assert len(first) == len(PROMPTS) and all(isinstance(t, str) and t for t in first)
    assert len(set(first)) == distinct
    assert model.training  # the mode is restored
    assert greedy_complete(model, tok, PROMPTS, batch_size=3, **kwargs) == first
    assert greedy_complete(model, tok, PROMPTS, batch_size=1, **kwargs) == first  # left padding changes nothing
    assert greedy_complete(model, tok, PROMPTS[::-1], batch_size=4, **kwargs) == first[::-1]


def test_greedy_complete_refuses_a_max_length_beyond_the_model() -> None:
    model, tok = build_tiny_model("tiny-llama")
    with pytest.raises(UserError, match="context of 128"):
        greedy_complete(model, tok, ["a"], max_new_tokens=4, max_length=129)


def fine_tuned(rows: list[tuple[str, str]], steps: int = 150):
    """A tiny Llama that has memorised ``rows`` (trained on the completion tokens only)."""
    model, tok = build_tiny_model("tiny-llama", seed=0, hidden_size=64)
    batch = collate_completions(
        encode_completions(tok, rows, max_length=64, template=HEADLINE_TEMPLATE), pad_token_id(tok)
    )
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), tok, loss.item()


def test_a_model_trained_on_the_labels_writes_its_completions_back_and_stops() -> None:
    rows = [
        ("The market rose today.", "Shares gain"),
        ("The team won the match.", "Late goal wins it"),
        ("Dull film.", "It was bad\nand long"),
    ]
    model, tok, loss = fine_tuned(rows)
    assert loss < 0.05
    prompts = [p for p, _ in rows]
    generate, outputs = model.generate, []

    def spy(*args, **kwargs):
        out = generate(*args, **kwargs)
        outputs.append(out[:, args[0].shape[1] :])
        return out

    model.generate = spy
    got = greedy_complete(
        model, tok, prompts, max_new_tokens=12, max_length=64, template=HEADLINE_TEMPLATE, batch_size=1
    )
    assert got == ["Shares gain", "Late goal wins it", "It was bad"]  # EOS stops the first two, the newline the third
    assert sorted(tok.decode(out[0]) for out in outputs) == [  # the third stopped at its newline
        " It was bad\n",
        " Late goal wins it<|endoftext|>",
        " Shares gain<|endoftext|>",
    ]
    assert greedy_complete(model, tok, prompts, max_new_tokens=12, max_length=64, template=HEADLINE_TEMPLATE) == got
    whole = greedy_complete(
        model, tok, prompts, max_new_tokens=12, max_length=64, template=HEADLINE_TEMPLATE, stop_at_newline=False
    )
    assert whole[2] == "It was bad\nand long"
