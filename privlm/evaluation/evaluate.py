"""One evaluation: fine-tune on a training set, score on test, optionally attack membership."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.evaluation.mia import membership_inference
from privlm.lm.finetune import finetune_classifier, select_and_finetune
from privlm.lm.finetune_checkpoint import EpochCheckpoint
from privlm.lm.finetune_config import FinetuneConfig
from privlm.lm.scoring import Example, evaluate_accuracy


def fit_and_score(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Example],
    test: Sequence[Example],
    template: str,
    label_words: Sequence[str],
    config: FinetuneConfig,
    *,
    validation: Sequence[Example] | None = None,
    members: Sequence[Example] | None = None,
    nonmembers: Sequence[Example] | None = None,
    grid: Sequence[FinetuneConfig] = (),
    on_step: Callable[[int, float], None] | None = None,
    checkpoint: EpochCheckpoint | None = None,
) -> dict[str, object]:
    """Fine-tune a copy of ``model`` on ``train`` (best epoch on ``validation`` if given) and score it.

    With a non-empty ``grid``, every configuration in it is tried and the best on ``validation`` is
    kept (``config`` then only sets ``max_length`` for scoring); the row gets ``selected`` and ``grid``.

    An empty ``train`` (a method whose filtering kept nothing) scores ``model`` itself: a classifier
    trained on nothing is the base model. With ``checkpoint``, a killed fine-tune resumes where it was last
    saved, every epoch and every ``checkpoint.every_s`` seconds within one (:mod:`privlm.lm.finetune_checkpoint`;
    the file is private).

    Returns a JSON-ready dict: test ``accuracy`` with its 95% bootstrap interval, ``n_train``,
    ``n_test``, ``best_epoch``, ``validation_accuracy``, and — when ``members`` and ``nonmembers``
    are given — the loss attack's ``mia_advantage`` and ``mia_auc``.
    """
    selection: dict[str, object] = {}
    if train and grid:
        result, tried = select_and_finetune(
            model, tokenizer, train, validation or (), template, label_words, grid, on_step, checkpoint
        )
        selection = {"selected": asdict(result.config), "grid": tried}
    elif train:
        result = finetune_classifier(
            model,
            tokenizer,
            train,
            template,
            label_words,
            config,
            validation=validation,
            on_step=on_step,
            checkpoint=checkpoint,
        )
    if train:
        tuned, best_epoch, validation_accuracy = result.model, result.best_epoch, result.validation_accuracy
    else:
        tuned, best_epoch, validation_accuracy = model, 0, None
    accuracy = evaluate_accuracy(tuned, tokenizer, test, template, label_words, max_length=config.max_length)
    row: dict[str, object] = {
        **accuracy.as_dict(),
        "n_train": len(train),
        "best_epoch": best_epoch,
        "validation_accuracy": validation_accuracy,
        **selection,
    }
    if members is not None and nonmembers is not None:
        attack = membership_inference(
            tuned, tokenizer, members, nonmembers, template, label_words, max_length=config.max_length
        )
        row.update(attack.as_dict())
    return row
