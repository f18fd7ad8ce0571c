"""Projection of continuous embeddings onto readable token sequences (the ADMM z-step).

Left to right, position i takes, among the ``top_k`` allowed tokens with the highest cosine similarity
to ``x_i``, the one with the highest next-token probability given the public prefix and the tokens
already decoded (one incremental forward per position with the KV cache). Allowed tokens are word-like:
after strip + lowercase they match ``^[a-z]+(?:['-][a-z]+)*$`` and have at most 17 characters.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

WORD_RE = re.compile(r"^[a-z]+(?:['-][a-z]+)*$")
MAX_WORD_CHARS = 17


def word_like_token_ids(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> torch.Tensor:
    """Ids (sorted, 1-D long) of the word-like tokens among the first ``vocab_size`` ids."""
    keep = []
    for tid in range(min(vocab_size, len(tokenizer))):
        word = tokenizer.decode([tid]).strip().lower()
        if len(word) <= MAX_WORD_CHARS and WORD_RE.match(word):
            keep.append(tid)
    return torch.tensor(keep, dtype=torch.long)


class Projector:
    """Maps embeddings (B × L × d) to token ids (B × L) of ``model``'s vocabulary (see module docstring)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prefix_ids: tuple[int, ...],
        top_k: int,
    ) -> None:
        self.model = model
        self.embedding = model.get_input_embeddings().weight.detach()
        self.allowed = word_like_token_ids(tokenizer, self.embedding.shape[0])
        if len(self.allowed) == 0:
            raise ValueError("the tokenizer has no word-like tokens to project onto")
        self.allowed_unit = F.normalize(self.embedding[self.allowed].to(torch.float32), dim=1)
        self.prefix_ids = torch.tensor(prefix_ids, dtype=torch.long)
        self.top_k = min(top_k, len(self.allowed))

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (B × L) for embeddings ``x`` (B × L × d)."""
        batch, length, _ = x.shape
        sims = F.normalize(x.detach().to(torch.float32), dim=2) @ self.allowed_unit.T
        candidates = self.allowed[sims.topk(self.top_k, dim=2).indices]  # B × L × k
        ids = torch.empty(batch, length, dtype=torch.long)
        past = None
        if len(self.prefix_ids):
            out = self.model(input_ids=self.prefix_ids.expand(batch, -1), use_cache=True, logits_to_keep=1)
            logits, past = out.logits[:, -1], out.cache
        for i in range(length):
            cand = candidates[:, i]
            if past is None:  # no prefix: the first token is the most similar allowed one
                choice = cand[:, 0]
            else:
                scores = torch.log_softmax(logits.to(torch.float32), dim=-1).gather(1, cand)
                choice = cand.gather(1, scores.argmax(dim=1, keepdim=True)).squeeze(1)
            ids[:, i] = choice
            if i + 1 < length:
                out = self.model(input_ids=choice[:, None], cache=past, use_cache=True, logits_to_keep=1)
                logits, past = out.logits[:, -1], out.cache
        return ids

    @torch.no_grad()
    def sample(self, batch: int, length: int, generator: torch.Generator, top_k: int = 50) -> torch.Tensor:
        """Token ids (batch × length) sampled from the public LM after the prefix, allowed tokens only.

        Each position draws from the ``top_k`` most probable allowed tokens (renormalized), with
        ``generator``: a fluent, data-independent starting point for ADMM.
        """
        ids = torch.empty(batch, length, dtype=torch.long)
        past = None
        inputs = self.prefix_ids.expand(batch, -1) if len(self.prefix_ids) else None
        for i in range(length):
            if inputs is None:  # no prefix: uniform over allowed tokens for the first position
                choice = self.allowed[torch.randint(len(self.allowed), (batch,), generator=generator)]
            else:
                out = self.model(input_ids=inputs, cache=past, use_cache=True, logits_to_keep=1)
                past = out.cache
                logits = out.logits[:, -1, self.allowed].to(torch.float32)
                top = logits.topk(min(top_k, len(self.allowed)), dim=1)
                pick = torch.multinomial(torch.softmax(top.values, dim=1), 1, generator=generator)
                choice = self.allowed[top.indices.gather(1, pick).squeeze(1)]
            ids[:, i] = choice
            inputs = choice[:, None]
        return ids

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings (B × L × d) of token ids (B × L)."""
        return self.embedding[ids]
