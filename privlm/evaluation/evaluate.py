"""One evaluation: fine-tune on a training set, score on test, optionally attack membership."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.evaluation.finetune import FinetuneConfig, finetune_classifier
from privlm.evaluation.mia import membership_inference
from privlm.evaluation.scoring import Example, evaluate_accuracy


def fit_and_score(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Example],
    test: Sequence[Example],
    suffix: str,
    label_words: Sequence[str],
    config: FinetuneConfig,
    *,
    validation: Sequence[Example] | None = None,
    members: Sequence[Example] | None = None,
    nonmembers: Sequence[Example] | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> dict[str, object]:
    """Fine-tune a copy of ``model`` on ``train`` (best epoch on ``validation`` if given) and score it.

    An empty ``train`` (a method whose filtering kept nothing) scores ``model`` itself: a classifier
    trained on nothing is the base model.

    Returns a JSON-ready dict: test ``accuracy`` with its 95% bootstrap interval, ``n_train``,
    ``n_test``, ``best_epoch``, ``validation_accuracy``, and — when ``members`` and ``nonmembers``
    are given — the loss attack's ``mia_advantage`` and ``mia_auc``.
    """
    if train:
        result = finetune_classifier(
            model, tokenizer, train, suffix, label_words, config, validation=validation, on_step=on_step
        )
        tuned, best_epoch, validation_accuracy = result.model, result.best_epoch, result.validation_accuracy
    else:
        tuned, best_epoch, validation_accuracy = model, 0, None
    accuracy = evaluate_accuracy(tuned, tokenizer, test, suffix, label_words, max_length=config.max_length)
    row: dict[str, object] = {
        **accuracy.as_dict(),
        "n_train": len(train),
        "best_epoch": best_epoch,
        "validation_accuracy": validation_accuracy,
    }
    if members is not None and nonmembers is not None:
        attack = membership_inference(
            tuned, tokenizer, members, nonmembers, suffix, label_words, max_length=config.max_length
        )
        row.update(attack.as_dict())
    return row
