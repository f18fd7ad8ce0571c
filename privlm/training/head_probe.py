"""The head-only downstream classifier: the label-word rows of the output layer fitted on a training set's
frozen features, scored on test — a second downstream evaluation beside the fine-tune.

For a verbalizer with label words w_1..w_K the output layer already is a K-way classifier, logit_c = h·W[t_c]
(:mod:`privlm.training.head`): h is the frozen model's final hidden state at the end of the prompt (the
position that predicts the label word) and t_c the first token of " w_c". :func:`head_probe` starts from
the model's own rows (the zero-shot classifier), fits them to the training set with AdamW on the K-way
cross-entropy (``epochs`` passes, seeded shuffling, mini-batches of ``batch_size``) and scores argmax_c on the
test set. Only K × d numbers are fitted, on features computed once (:func:`prompt_features`): fast, and
far less variable from seed to seed than fine-tuning the whole model on a few hundred texts — the same model
class as ``privlm train --head-only``, the DP reference trained on the real data directly.

Not a DP mechanism: it reads the training set as given (a released synthetic set, or a real-data reference
that is not private by design) and the test split.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.lm.features import hidden_features
from privlm.lm.prompts import split_prompt
from privlm.lm.scoring import Example, accuracy_ci
from privlm.resources.verbalizers import Verbalizer
from privlm.training.head import label_token_ids, label_word_rows
from privlm.training.head_probe_config import HeadProbeConfig


def prompt_features(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    template: str,
    max_length: int,
) -> Tensor:
    """h (len(texts), d), float64: the final hidden state at the last token of each text's prompt (the
    template filled and its trailing whitespace moved to the label word, as the label-word scoring does)."""
    contexts = [split_prompt(text, template, "")[0] for text in texts]
    return torch.from_numpy(hidden_features(model, tokenizer, contexts, "last", max_length=max_length))


def fit_rows(initial: Tensor, features: Tensor, classes: Tensor, config: HeadProbeConfig, seed: int) -> Tensor:
    """The K label-word rows (K, d) fitted from ``initial`` to ``features`` (n, d) and ``classes`` (n,), float64;
    deterministic for a seed. No rows to fit on (n = 0) leaves ``initial``."""
    rows = initial.detach().clone().double().requires_grad_(True)
    if len(features) == 0:
        return rows.detach()
    optimizer = torch.optim.AdamW([rows], lr=config.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(config.epochs):
        for batch in torch.randperm(len(features), generator=generator).split(config.batch_size):
            optimizer.zero_grad()
            F.cross_entropy(features[batch] @ rows.T, classes[batch]).backward()
            optimizer.step()
    return rows.detach()


def head_probe(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Example],
    test_features: Tensor,
    test_classes: Tensor,
    template: str,
    label_words: Sequence[str],
    config: HeadProbeConfig,
    seed: int,
) -> dict[str, float]:
    """Fit the label-word rows on ``train`` and score them on the test features (:func:`prompt_features`):
    ``{"head_accuracy", "head_ci_low", "head_ci_high"}`` (95 % bootstrap interval over test examples). An
    empty ``train`` scores the model's own rows (the zero-shot classifier)."""
    initial = label_word_rows(model, label_token_ids(tokenizer, Verbalizer(template, tuple(label_words))))
    features = prompt_features(model, tokenizer, [t for t, _ in train], template, config.max_length)
    classes = torch.tensor([y for _, y in train], dtype=torch.long)
    rows = fit_rows(initial, features, classes, config, seed)
    predicted = (test_features @ rows.T).argmax(1).numpy()
    accuracy = accuracy_ci(predicted == test_classes.numpy(), seed=seed)
    return {"head_accuracy": accuracy.value, "head_ci_low": accuracy.low, "head_ci_high": accuracy.high}
