"""Loss-based membership inference (Yeom et al. 2018) against a fine-tuned label-word classifier.

The attack scores an example by its negative loss (the length-normalized cross-entropy of its true
label word, the loss the classifier was trained on): a lower loss suggests a member. Over every
threshold, advantage = max |TPR − FPR| and AUC come from scikit-learn's ROC. Members are the private
pool; non-members are a held-out set from the same distribution, of equal size in our experiments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import roc_auc_score, roc_curve
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.lm.scoring import Example, option_scores


@dataclass(frozen=True)
class MembershipResult:
    """Advantage (max |TPR − FPR| over thresholds) and AUC of the loss attack, with the set sizes."""

    advantage: float
    auc: float
    n_members: int
    n_nonmembers: int

    def as_dict(self) -> dict[str, float]:
        return {"mia_advantage": self.advantage, "mia_auc": self.auc}


def example_losses(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    template: str,
    label_words: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int = 256,
) -> np.ndarray:
    """Per-example loss: minus the mean log-probability of the true label word's tokens, shape ``(N,)``."""
    scores = option_scores(
        model, tokenizer, [t for t, _ in examples], template, label_words, batch_size=batch_size, max_length=max_length
    )
    return -scores[np.arange(len(examples)), [y for _, y in examples]]


def attack_from_losses(member_losses: np.ndarray, nonmember_losses: np.ndarray) -> MembershipResult:
    """ROC of the threshold attack "member if loss ≤ τ"; both inputs are 1-D and non-empty."""
    member_losses, nonmember_losses = np.asarray(member_losses), np.asarray(nonmember_losses)
    if member_losses.size == 0 or nonmember_losses.size == 0:
        raise UserError("membership inference needs at least one member and one non-member")
    truth = np.r_[np.ones(member_losses.size), np.zeros(nonmember_losses.size)]
    score = -np.r_[member_losses, nonmember_losses]
    fpr, tpr, _ = roc_curve(truth, score)
    return MembershipResult(
        advantage=float(np.max(np.abs(tpr - fpr))),
        auc=float(roc_auc_score(truth, score)),
        n_members=member_losses.size,
        n_nonmembers=nonmember_losses.size,
    )


def membership_inference(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    members: Sequence[Example],
    nonmembers: Sequence[Example],
    template: str,
    label_words: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int = 256,
) -> MembershipResult:
    """Loss attack on ``model``: members vs non-members, scored by their label-word losses."""
    kwargs = {"batch_size": batch_size, "max_length": max_length}
    return attack_from_losses(
        example_losses(model, tokenizer, members, template, label_words, **kwargs),
        example_losses(model, tokenizer, nonmembers, template, label_words, **kwargs),
    )
