"""A shared prefix's keys and values, computed once, give the hidden states of the whole sequences."""

from __future__ import annotations

import pytest
import torch

from privlm.lm.shared_prefix import SharedPrefix
from privlm.resources.tiny import build_tiny_model


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_last_hidden_equals_the_pass_over_prefix_and_sequence(name: str) -> None:
    model, _ = build_tiny_model(name, seed=1, dtype=torch.float64)
    model.eval()
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(1, 500, (17,), generator=g).tolist()
    seqs = [torch.randint(1, 500, (n,), generator=g).tolist() for n in (3, 9, 1, 6)]  # padding inside a batch
    with torch.no_grad():
        expected = torch.stack(
            [model.base_model(input_ids=torch.tensor([prefix + s])).last_hidden_state[0, -1] for s in seqs]
        )
    shared = SharedPrefix(model, prefix)
    torch.testing.assert_close(shared.last_hidden(seqs), expected, rtol=0, atol=1e-10)
    # the cached prefix is read, never extended: a second, smaller batch sees the same prefix
    torch.testing.assert_close(shared.last_hidden(seqs[1:3]), expected[1:3], rtol=0, atol=1e-10)


def test_an_empty_prefix_runs_the_sequences_alone() -> None:
    model, _ = build_tiny_model("tiny-llama", seed=1, dtype=torch.float64)
    model.eval()
    seqs = [[5, 6, 7], [8]]
    with torch.no_grad():
        expected = torch.stack([model.base_model(input_ids=torch.tensor([s])).last_hidden_state[0, -1] for s in seqs])
    torch.testing.assert_close(SharedPrefix(model, []).last_hidden(seqs), expected, rtol=0, atol=1e-10)
