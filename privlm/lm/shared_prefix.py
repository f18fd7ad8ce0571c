"""The final hidden states of many sequences that open with one shared, public token prefix.

Scoring thousands of short texts behind the same long context (fixed few-shot demonstrations, an
instruction) spends most of its work on that context again and again. :class:`SharedPrefix` runs the
prefix through the model once, keeps its attention keys and values, and runs each batch of sequences on
top of them: the same causal attention, so the hidden states are those of ``prefix + sequence`` up to
floating-point rounding (tested against the uncached pass on Llama- and GPT-2-style models).

Meant for public prefixes only (the cache is not protected like private data is): what privlm puts here
is its own demonstrations and the verbalizer's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from privlm.resources.padding import padded_batch


class SharedPrefix:
    """The model's keys and values of ``prefix_ids`` (computed once, in inference mode), for
    :meth:`last_hidden` of sequences that follow it. An empty prefix is allowed: nothing is cached and
    each batch runs alone."""

    def __init__(self, model: PreTrainedModel, prefix_ids: Sequence[int]) -> None:
        self.model = model
        self.length = len(prefix_ids)
        self._layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        if self.length:
            with torch.inference_mode():
                out = model.base_model(input_ids=torch.tensor([list(prefix_ids)]), use_cache=True)
            self._layers = [(layer.keys, layer.values) for layer in out.cache.layers]

    @torch.inference_mode()
    def last_hidden(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """Final hidden state (after the final norm), ``(len(sequences), d)``, at each sequence's own last
        token, as the model computes it for ``prefix + sequence`` (right padding behind a mask).
        Every sequence must hold at least one token."""
        ids, mask, lengths = padded_batch(sequences)
        rows = len(sequences)
        # expand() shares the prefix's memory; the forward pass appends to a new cache, never to it
        cache = DynamicCache([(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in self._layers])
        attended = torch.cat([torch.ones(rows, self.length, dtype=mask.dtype), mask], dim=1)
        out = self.model.base_model(
            input_ids=ids, attention_mask=attended, cache=cache if self.length else None, use_cache=bool(self.length)
        )
        return out.last_hidden_state[torch.arange(rows), lengths - 1]
