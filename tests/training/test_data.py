"""Training data: label-word targets for classify, first-T-token targets for lm, T ≤ context, labels required;
length-sorted micro-batches of token batches give the whole batch's clipped sum."""

from __future__ import annotations

import json

import pytest
import torch

from privlm.dpsgd.clipping import PerSampleClipper
from privlm.dpsgd.engine import PrivateModel
from privlm.dpsgd.losses import causal_lm_losses
from privlm.dpsgd.sampling import physical_batches
from privlm.errors import UserError
from privlm.lm.prompts import IGNORE_INDEX
from privlm.randomness import SecureRandom
from privlm.resources.tiny import build_tiny_model, tiny_tokenizer
from privlm.resources.verbalizers import Verbalizer
from privlm.training.data import (
    TaskData,
    check_max_length,
    encode,
    length_sorted_token_batches,
    load_task_data,
    make_collate,
)

VERBALIZER = Verbalizer(" It was ", ("bad", "great"))


def test_classify_targets_are_the_label_words_and_long_texts_keep_the_suffix():
    tok = tiny_tokenizer()
    long_text = ("the movie was slow " * 40).strip()
    data = TaskData("classify", (("a fine film", 1), (long_text, 0)), (), VERBALIZER)
    rows = encode(data, tok, max_length=24)
    assert all(len(r.input_ids) <= 24 for r in rows) and len(rows[1].input_ids) == 24
    batch = make_collate(tok)(rows)
    for row, word in zip(range(2), ("great", "bad")):
        targets = batch["labels"][row][batch["labels"][row] != IGNORE_INDEX].tolist()
        assert tok.decode(targets) == " " + word
    assert tok.decode(rows[1].input_ids).endswith("slow It was bad")  # cut from the left


def test_lm_targets_are_the_first_t_tokens():
    tok = tiny_tokenizer()
    text = "private text must be protected " * 10
    (row,) = encode(TaskData("lm", (text,), (), None), tok, max_length=16)
    assert row.input_ids == tok(text)["input_ids"][:16] and row.n_option_tokens == 16
    batch = make_collate(tok)([row])
    assert batch["labels"][0].tolist() == row.input_ids


def test_max_length_must_fit_the_model_context():
    model, _ = build_tiny_model("tiny-llama")
    check_max_length(model, 128)
    with pytest.raises(UserError, match="129 is larger than the model's context of 128"):
        check_max_length(model, 129)
    with pytest.raises(UserError, match="--max-length"):
        check_max_length(model, 1)


def test_unlabelled_jsonl_serves_lm_only(tmp_path):
    path = tmp_path / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": f"text number {i}"}) + "\n" for i in range(30)))
    data = load_task_data(f"jsonl:{path}", "lm")
    assert len(data.train) + len(data.test) <= 30 and 1 <= len(data.test) <= 10  # per-row split: ≈ 10 % test
    assert not set(data.train) & set(data.test)
    longer = tmp_path / "more.jsonl"  # one more row moves no other row between train and test
    longer.write_text(path.read_text() + json.dumps({"text": "one more text"}) + "\n")
    grown = load_task_data(f"jsonl:{longer}", "lm")
    assert set(data.train) <= set(grown.train) and set(data.test) <= set(grown.test)
    with pytest.raises(UserError, match="--labels"):
        load_task_data(f"jsonl:{path}", "classify")
    with pytest.raises(UserError, match=":1: missing 'label'"):  # classify needs every row labelled
        load_task_data(f"jsonl:{path}", "classify", labels="neg,pos")
    mixed = tmp_path / "mixed.jsonl"  # lm reads every row's text, labelled or not
    mixed.write_text(json.dumps({"text": "labelled", "label": "pos"}) + "\n" + path.read_text())
    assert len(load_task_data(f"jsonl:{mixed}", "lm").train) >= len(data.train)
    with pytest.raises(UserError, match="--task"):
        load_task_data(f"jsonl:{path}", "regress")


@pytest.mark.parametrize("mode", ["mixed", "hutchinson"])
def test_length_sorted_token_micro_batches_give_the_whole_batch_clipped_sum(mode):
    model, tok = build_tiny_model("tiny-llama", seed=0, dtype=torch.float64)
    texts = tuple("the market rose " * (1 + i * 5 % 11) for i in range(10))
    batch = make_collate(tok)(encode(TaskData("lm", texts, (), None), tok, max_length=64))
    micro = list(length_sorted_token_batches(batch, 4))
    lengths = [int(n) for m in micro for n in m["attention_mask"].sum(1)]
    assert lengths == sorted(batch["attention_mask"].sum(1).tolist(), reverse=True)  # every row once
    for m in micro:  # each cut to its own longest row
        assert set(m) == set(batch) and int(m["attention_mask"][:, -1].max()) == 1
    assert sum(m["input_ids"].numel() for m in micro) < batch["input_ids"].numel()
    sums = []
    for cut, size in ((physical_batches, None), (length_sorted_token_batches, 4)):
        clipper = PerSampleClipper(
            model,
            causal_lm_losses,
            max_grad_norm=0.05,
            norm_mode=mode,
            probes=6,
            randomness=SecureRandom.from_seed(0, "probes"),
        )
        clipper.begin_step(1)
        stats = PrivateModel(model, clipper, size, cut).clipped_backward(batch)
        clipper.capture.remove()
        assert bool((stats.factors < 1).all())
        sums.append({p: g.clone() for p, g in clipper.summed_grads.items()})
    assert len(sums[0]) > 0
    for p, whole in sums[0].items():  # eager attention's float32 softmax rounds other widths differently
        torch.testing.assert_close(sums[1][p], whole, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="input_ids, attention_mask and labels"):
        next(length_sorted_token_batches({"features": batch["input_ids"]}, 4))
