"""Which layers are captured: frozen parameters ignored, unsupported trainable layers refused by name."""

from __future__ import annotations

import pytest
from dpsgd_harness import tiny_model
from torch import nn

from privlm.dpsgd.hooks import trainable_layers, trainable_parameters
from privlm.errors import UserError


def test_unsupported_trainable_layer_is_refused_by_name():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Conv1d(4, 4, 1), nn.Linear(4, 2))
    with pytest.raises(UserError, match=r"1\.weight.*Conv1d"):
        trainable_layers(model)


def test_frozen_unsupported_layer_is_ignored():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Conv1d(4, 4, 1), nn.Linear(4, 2))
    for p in model[1].parameters():
        p.requires_grad_(False)
    assert set(trainable_layers(model)) == {model[0], model[2]}


def test_embedding_with_max_norm_is_refused():
    with pytest.raises(UserError, match="max_norm"):
        trainable_layers(nn.Sequential(nn.Embedding(10, 4, max_norm=1.0)))


def test_lora_captures_only_adapters_and_tied_weight_counts_once():
    lora = tiny_model("tiny-llama", lora=True)
    layers = trainable_layers(lora)
    assert layers and all(isinstance(m, nn.Linear) and m.weight.requires_grad for m in layers)
    full = tiny_model("tiny-llama")
    params = trainable_parameters(full)
    assert len(params) == len({id(p) for p in params}) == len(list(full.parameters()))
    assert sum(m.weight is full.get_input_embeddings().weight for m in trainable_layers(full)) == 2
