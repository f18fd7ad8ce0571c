"""Projection of continuous embeddings onto readable token sequences (the ADMM z-step).

Left to right, position i takes, among the ``top_k`` allowed tokens with the highest cosine similarity
to ``x_i``, the one with the highest next-token probability given the public context and the tokens
already decoded (one incremental forward per position with the KV cache). Allowed tokens are word-like:
after strip + lowercase they match ``^[a-z]+(?:['-][a-z]+)*$`` and have at most 17 characters.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

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
    """Maps embeddings (B × L × d) to token ids (B × L) of ``model``'s vocabulary (see module docstring).

    ``context_ids`` is the public text the LM conditions on when it scores candidates (the document
    prefix, optionally followed by public few-shot demonstrations); it is encoded once and its KV
    cache reused by every call.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        context_ids: tuple[int, ...],
        top_k: int,
    ) -> None:
        self.model = model
        self.embedding = model.get_input_embeddings().weight.detach()
        self.allowed = word_like_token_ids(tokenizer, self.embedding.shape[0])
        if len(self.allowed) == 0:
            raise ValueError("the tokenizer has no word-like tokens to project onto")
        self.allowed_unit = F.normalize(self.embedding[self.allowed].to(torch.float32), dim=1)
        self.top_k = min(top_k, len(self.allowed))
        self._context = None
        if context_ids:
            with torch.no_grad():
                out = model(input_ids=torch.tensor([context_ids]), use_cache=True, logits_to_keep=1)
            self._context = (out.logits[:, -1], out.cache)

    def _decode(
        self, batch: int, length: int, choose: Callable[[int, torch.Tensor | None], torch.Tensor]
    ) -> torch.Tensor:
        """Left-to-right decoding: ``choose(i, next_token_logits or None) -> ids (batch)``, KV-cached."""
        ids = torch.empty(batch, length, dtype=torch.long)
        logits, cache = None, None
        if self._context is not None:
            logits = self._context[0].expand(batch, -1)
            cache = copy.deepcopy(self._context[1])
            cache.batch_repeat_interleave(batch)
        for i in range(length):
            ids[:, i] = choose(i, None if logits is None else logits.to(torch.float32))
            if i + 1 < length:
                out = self.model(input_ids=ids[:, i : i + 1], cache=cache, use_cache=True, logits_to_keep=1)
                logits, cache = out.logits[:, -1], out.cache
        return ids

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (B × L) for embeddings ``x`` (B × L × d)."""
        batch, length, _ = x.shape
        sims = F.normalize(x.detach().to(torch.float32), dim=2) @ self.allowed_unit.T
        candidates = self.allowed[sims.topk(self.top_k, dim=2).indices]  # B × L × k

        def choose(i: int, logits: torch.Tensor | None) -> torch.Tensor:
            cand = candidates[:, i]
            if logits is None:  # no context: the first token is the most similar allowed one
                return cand[:, 0]
            scores = torch.log_softmax(logits, dim=-1).gather(1, cand)
            return cand.gather(1, scores.argmax(dim=1, keepdim=True)).squeeze(1)

        return self._decode(batch, length, choose)

    @torch.no_grad()
    def sample(self, batch: int, length: int, generator: torch.Generator, top_k: int = 50) -> torch.Tensor:
        """Token ids (batch × length) sampled from the public LM after the context, allowed tokens only.

        Each position draws from the ``top_k`` most probable allowed tokens (renormalized), with
        ``generator``: a fluent, data-independent starting point for ADMM.
        """

        def choose(i: int, logits: torch.Tensor | None) -> torch.Tensor:
            if logits is None:  # no context: uniform over allowed tokens for the first position
                return self.allowed[torch.randint(len(self.allowed), (batch,), generator=generator)]
            top = logits[:, self.allowed].topk(min(top_k, len(self.allowed)), dim=1)
            pick = torch.multinomial(torch.softmax(top.values, dim=1), 1, generator=generator)
            return self.allowed[top.indices.gather(1, pick).squeeze(1)]

        return self._decode(batch, length, choose)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings (B × L × d) of token ids (B × L)."""
        return self.embedding[ids]
