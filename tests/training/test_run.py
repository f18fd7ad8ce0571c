"""``with_lora``: adapters on every linear layer, or only on the last N decoder blocks (Llama and GPT-2
naming), in which case nothing below those blocks is trained and the backward pass stops there."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from privlm.dpsgd.losses import label_word_lm_losses
from privlm.errors import UserError
from privlm.resources.tiny import build_tiny_model
from privlm.training.head import label_token_ids
from privlm.training.loop import TrainConfig
from privlm.training.run import set_up, top_block_linears, with_lora


def _trainable_blocks(module: torch.nn.Module) -> set[int]:
    return {
        int(m.group(1))
        for name, p in module.named_parameters()
        if p.requires_grad and (m := re.search(r"\.(?:layers|h)\.(\d+)\.", name))
    }


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_lora_on_the_last_blocks_only(name):
    model, _ = build_tiny_model(name, seed=0, layers=3)
    module = with_lora(model, 4, seed=0, blocks=2)
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert _trainable_blocks(module) == {1, 2}
    every = with_lora(build_tiny_model(name, seed=0, layers=3)[0], 4, seed=0)
    assert _trainable_blocks(every) == {0, 1, 2}


def test_backward_stops_above_the_frozen_blocks():
    model, _ = build_tiny_model("tiny-llama", seed=0, layers=3)
    module = with_lora(model, 4, seed=0, blocks=1)
    seen = []
    model.model.layers[1].register_forward_hook(
        lambda mod, args, out: seen.append(out if torch.is_tensor(out) else out[0])
    )
    module(input_ids=torch.arange(8).unsqueeze(0), labels=torch.arange(8).unsqueeze(0)).loss.backward()
    assert not seen[0].requires_grad  # block 1's output carries no graph: autograd never enters blocks 0-1


def test_lora_block_count_is_checked():
    model, _ = build_tiny_model("tiny-llama", seed=0, layers=3)
    assert len(top_block_linears(model, 3)) == 3 * 7  # q, k, v, o, gate, up, down per Llama block
    for bad in (0, 4):
        with pytest.raises(UserError, match="1..3"):
            top_block_linears(model, bad)
    with pytest.raises(UserError, match="needs --lora"):
        with_lora(model, 0, seed=0, blocks=1)


def test_classify_trains_lora_on_the_label_word_objective(tmp_path):
    """``set_up`` wires the K-way label-word loss into the loop for a LoRA classifier (not the token loss)."""
    data = tmp_path / "reviews.jsonl"
    data.write_text(
        "".join(
            json.dumps({"text": f"review {i}: the film was " + "so " * (i % 3), "label": ["neg", "pos"][i % 2]}) + "\n"
            for i in range(40)
        )
    )
    config = TrainConfig(noise_multiplier=1.0, lora=4, batch_size=4, max_length=32, seed=0)
    session = set_up("tiny-llama", f"jsonl:{data}", config, labels="neg=good,pos=great")
    batch = session.run.collate(list(session.run.rows[:5]))
    ids = torch.tensor(label_token_ids(session.tokenizer, session.data.verbalizer))
    expected = label_word_lm_losses(session.module, batch, ids)
    torch.testing.assert_close(session.run.loss_fn(session.module, batch), expected, rtol=0, atol=0)
    assert float(expected.max()) < 0.5 * math.log(512)  # a 2-way loss: far below a 512-token vocabulary's loss
