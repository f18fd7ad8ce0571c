"""Temperature and nucleus (top-p) filtering of next-token scores without sorting the whole vocabulary.

transformers' ``TopPLogitsWarper`` sorts every row of scores (49,152 entries for SmolLM2) at every decoding
step. A nucleus at top-p 0.95 is usually a few hundred tokens, so :class:`NucleusFilter` takes the top ``k`` of
each row (``torch.topk``), computes the nucleus there and falls back to the warper itself only for rows it cannot
decide. Sampling with it takes 0.71× the time with the warper (``benchmarks/sampling.py``: PE rewrites, 48
sequences, 40 new tokens, one CPU core).

It keeps the warper's tokens, so ``generate`` draws the same samples from the same seed:

- The rule is the warper's: a token is removed when the probability mass of it and every token below it is at
  most ``1 - top_p`` (compared in float32, as the warper compares), the most likely token always kept.
- The warper computes that mass in float32 (softmax of the sorted row, then a cumulative sum); this module
  computes it in float64 from the unsorted row. The two differ by rounding only, and the rounding grows with the
  mass (the float32 softmax's normalizer): at top-p 0.95, at most 2.1·10⁻⁸ near the boundary on 3,840 rows of
  SmolLM2's scores (the benchmark's ``filter_check``, CPU); up to 8·10⁻⁷ near a mass of 0.9 on 64 synthetic rows
  of 49,152 entries (``tests/lm/test_nucleus.py``).
- So a row is decided here only when the tokens on both sides of the boundary are more than ``margin`` away
  from it (10⁻⁷ + 5·10⁻⁵ · (1 − top-p): 2.6·10⁻⁶ at top-p 0.95, 4.5·10⁻⁵ at 0.1) and do not tie. Any other
  row, and any row whose nucleus is not within its top ``k`` for the largest ``k``, goes to ``TopPLogitsWarper``.
- The guarantee is measured on CPU only. On a GPU, where torch's cumulative sum accumulates in float32, the
  warper's rounding is not measured (no device was lent).

In ``generate``, processors passed as ``logits_processor`` run after generate's own (repetition penalty, token
suppression, …) and before its warpers, so with temperature and top-p given here, the order is the one the
warpers had, except for a ``top_h`` set in a model's generation config, which now runs after top-p, not
between temperature and top-p.

The agreement with the warpers is tested bit for bit (``tests/lm/test_nucleus.py``) on rows from flat to peaked,
on ties across the boundary and on masses within the margin.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessor
from transformers.generation.logits_process import TopPLogitsWarper

from privlm.errors import UserError


class NucleusFilter(LogitsProcessor):
    """``TemperatureLogitsWarper(temperature)`` then ``TopPLogitsWarper(top_p)`` of transformers, with the
    warpers' result, for ``generate(logits_processor=...)`` called with ``temperature=1.0, top_p=1.0`` (so
    that ``generate`` adds neither warper itself).

    ``scores``: (batch, vocab) next-token logits; returns them divided by ``temperature``, with the tokens
    outside each row's nucleus set to −inf. ``candidates``: the increasing ``k`` tried with ``torch.topk``
    before the warper's full sort. ``margin``: (floor, share): a row is decided here only when its boundary masses
    are more than ``floor + share · (1 − top_p)`` from ``1 − top_p``. ``rows`` and ``rows_to_warper`` count the rows
    filtered and those handed to the warper. Raises :class:`UserError` for top_p outside (0, 1] or a temperature
    that is not positive."""

    def __init__(
        self,
        top_p: float,
        temperature: float = 1.0,
        candidates: Sequence[int] = (512, 4096),
        margin: tuple[float, float] = (1e-7, 5e-5),
    ) -> None:
        if not 0.0 < top_p <= 1.0:
            raise UserError(f"top_p must be in (0, 1], got {top_p}")
        if not temperature > 0.0:
            raise UserError(f"temperature must be positive, got {temperature}")
        self.top_p, self.temperature, self.candidates = top_p, temperature, tuple(candidates)
        # the warper compares its float32 masses with the Python float 1 - top_p, which torch rounds to float32
        self.threshold = torch.tensor(1.0 - top_p, dtype=torch.float32).item()
        # the warper's rounding grows with the mass (its softmax's float32 normalizer): an absolute floor plus a
        # share of the threshold
        self.margin = margin[0] + margin[1] * self.threshold
        self.rows = self.rows_to_warper = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature != 1.0:
            scores = scores / self.temperature
        if self.top_p >= 1.0:
            return scores
        remove = torch.ones_like(scores, dtype=torch.bool)
        rows, to_warper = torch.arange(scores.shape[0], device=scores.device), []
        log_total = torch.logsumexp(scores.double(), dim=-1)
        for k in sorted({min(k, scores.shape[-1]) for k in self.candidates}):
            decided, masks, beyond = self._decide(scores[rows], log_total[rows], k)
            remove[rows[decided]] = masks
            to_warper.append(rows[~decided & ~beyond])  # a boundary in the margin or a tie: no k decides it
            rows = rows[beyond]  # the nucleus is larger than k: a larger k may decide it
            if len(rows) == 0:
                break
        undecided = torch.cat([*to_warper, rows])
        out = scores.masked_fill(remove, -float("inf"))
        self.rows, self.rows_to_warper = self.rows + scores.shape[0], self.rows_to_warper + len(undecided)
        if len(undecided):
            out[undecided] = TopPLogitsWarper(self.top_p)(input_ids[undecided], scores[undecided])
        return out

    def _decide(
        self, scores: torch.Tensor, log_total: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Which rows of ``scores`` (r, vocab; ``log_total``: each row's float64 log-sum-exp) are decided from
        their top ``k``, those rows' masks of removed tokens (decided rows, vocab), and which rows' nuclei reach
        beyond the top ``k``."""
        top, index = scores.topk(k, dim=-1)
        probs = (top.double() - log_total[:, None]).exp()
        # mass of each top token and every token below it: 1 − the mass strictly above it
        below = 1.0 - (probs.cumsum(-1) - probs)
        kept = (below > self.threshold).sum(-1)  # the masses fall along the row: a prefix is kept
        beyond = kept == k  # the first removed token is not among the top k
        last, first = (kept - 1).clamp(min=0, max=k - 1), kept.clamp(max=k - 1)

        def far(rank: torch.Tensor) -> torch.Tensor:
            return (below.gather(1, rank[:, None])[:, 0] - self.threshold).abs() > self.margin

        tie = top.gather(1, last[:, None])[:, 0] == top.gather(1, first[:, None])[:, 0]
        decided = ~beyond & far(last) & far(first) & ~tie
        rank = torch.arange(k, device=scores.device)
        masks = torch.ones(int(decided.sum()), scores.shape[-1], dtype=torch.bool, device=scores.device)
        masks.scatter_(1, index[decided], rank[None, :] >= kept[decided, None])
        return decided, masks, beyond
