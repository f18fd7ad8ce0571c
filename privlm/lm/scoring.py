"""Label-word scoring of a causal LM classifier, and test accuracy with a bootstrap interval.

For a text and each class c, the score is the option log-likelihood of the label word w_c after
``template`` filled with the text (:func:`privlm.resources.verbalizers.fill`) (layout in :mod:`privlm.lm.prompts`); with ``normalize=True`` it is the mean
over the tokens of w_c (length-normalized), else their sum. The predicted label is the argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.lm.prompts import IGNORE_INDEX, EncodedOption, collate, encode_option, pad_token_id

Example = tuple[str, int]


def option_logprobs(model: PreTrainedModel, batch: dict[str, torch.Tensor], normalize: bool = True) -> torch.Tensor:
    """Log-likelihood of each row's option tokens (``labels != IGNORE_INDEX``), shape ``(B,)``.

    Differentiable (used as the fine-tuning loss); padding and context positions contribute nothing.
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]
    token_nll = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), targets, ignore_index=IGNORE_INDEX, reduction="none"
    )
    total = -token_nll.sum(dim=1)
    if not normalize:
        return total
    return total / (targets != IGNORE_INDEX).sum(dim=1)


def option_scores(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    template: str,
    label_words: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int = 256,
    normalize: bool = True,
) -> np.ndarray:
    """Scores of every (text, class), shape ``(len(texts), len(label_words))``, float64.

    Sequences are batched by length (less padding); the result does not depend on ``batch_size``
    beyond floating-point noise. When every label word is a single token after the same context (as
    " great" / " bad" for SmolLM2), one forward per text scores all classes; otherwise one per (text, class).
    """
    if batch_size < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")
    options = [[encode_option(tokenizer, t, template, w, max_length) for w in label_words] for t in texts]
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            if all(_single_token_options(per_text) for per_text in options):
                return _score_single_tokens(model, options, pad_token_id(tokenizer), batch_size)
            flat_options = [o for per_text in options for o in per_text]
            return _score_each_option(model, flat_options, pad_token_id(tokenizer), batch_size, normalize).reshape(
                len(texts), len(label_words)
            )
    finally:
        model.train(was_training)


def _single_token_options(options: Sequence[EncodedOption]) -> bool:
    """Every label word is one token after one shared context (then one forward scores all classes)."""
    return all(o.n_option_tokens == 1 and o.input_ids[:-1] == options[0].input_ids[:-1] for o in options)


def _score_single_tokens(
    model: PreTrainedModel, options: Sequence[Sequence[EncodedOption]], pad: int, batch_size: int
) -> np.ndarray:
    """Next-token log-probabilities of the label tokens at the end of each context, ``(N, C)``."""
    scores = np.empty((len(options), len(options[0])), dtype=np.float64)
    order = sorted(range(len(options)), key=lambda i: len(options[i][0].input_ids))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = collate([options[i][0] for i in idx], pad)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        last = batch["attention_mask"].sum(dim=1) - 2  # position that predicts the label token
        logp = torch.log_softmax(logits[torch.arange(len(idx)), last].float(), dim=-1)
        words = torch.tensor([[o.input_ids[-1] for o in options[i]] for i in idx])
        scores[idx] = logp.gather(1, words).double().numpy()
    return scores


def _score_each_option(
    model: PreTrainedModel, options: Sequence[EncodedOption], pad: int, batch_size: int, normalize: bool
) -> np.ndarray:
    """One sequence per (text, class), batched by length; flat scores in ``options`` order."""
    order = sorted(range(len(options)), key=lambda i: len(options[i].input_ids))
    flat = np.empty(len(options), dtype=np.float64)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        flat[idx] = option_logprobs(model, collate([options[i] for i in idx], pad), normalize).double().numpy()
    return flat


@dataclass(frozen=True)
class Accuracy:
    """Accuracy on ``n`` examples with a percentile-bootstrap interval ``[low, high]``."""

    value: float
    low: float
    high: float
    n: int
    confidence: float

    def as_dict(self) -> dict[str, float]:
        return {"accuracy": self.value, "ci_low": self.low, "ci_high": self.high, "n_test": self.n}


def accuracy_ci(correct: np.ndarray, *, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0) -> Accuracy:
    """Mean of the 0/1 vector ``correct`` with a percentile bootstrap interval (``scipy.stats.bootstrap``)."""
    correct = np.asarray(correct, dtype=np.float64)
    if correct.ndim != 1 or correct.size == 0:
        raise UserError("accuracy needs a non-empty 1-D vector of 0/1 outcomes")
    value = float(correct.mean())
    if correct.min() == correct.max():  # every resample has the same mean
        return Accuracy(value, value, value, correct.size, confidence)
    result = stats.bootstrap(
        (correct,),
        np.mean,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    ci = result.confidence_interval
    return Accuracy(value, float(ci.low), float(ci.high), correct.size, confidence)


def evaluate_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    template: str,
    label_words: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int = 256,
    seed: int = 0,
) -> Accuracy:
    """Label-word accuracy of ``model`` on ``examples`` with a 95% bootstrap interval."""
    if not examples:
        raise UserError("no test examples to score")
    texts = [t for t, _ in examples]
    labels = np.array([y for _, y in examples])
    scores = option_scores(model, tokenizer, texts, template, label_words, batch_size=batch_size, max_length=max_length)
    return accuracy_ci(scores.argmax(axis=1) == labels, seed=seed)
