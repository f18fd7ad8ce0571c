"""Fine-tune a causal LM as a label-word classifier (full fine-tuning or LoRA through peft).

The loss of an example (text, y) is the length-normalized cross-entropy of the label word w_y given
``template`` filled with the text (:func:`privlm.resources.verbalizers.fill`) — the negative of the score in :mod:`privlm.lm.scoring`, so training and
scoring see the same tokens. Hyperparameters are fixed per preset, or chosen on a *validation* split
(best epoch, and best configuration of a small grid); the test split is never looked at here.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.lm.finetune_checkpoint import EpochCheckpoint
from privlm.lm.finetune_config import FinetuneConfig
from privlm.lm.prompts import collate, encode_option, pad_token_id
from privlm.lm.scoring import Example, evaluate_accuracy, option_logprobs


@dataclass
class FinetuneResult:
    """The fine-tuned model (eval mode, LoRA merged), per-epoch history and the kept epoch."""

    model: PreTrainedModel
    config: FinetuneConfig
    history: list[dict[str, float]] = field(default_factory=list)
    best_epoch: int = 0
    validation_accuracy: float | None = None


def finetune_classifier(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Example],
    template: str,
    label_words: Sequence[str],
    config: FinetuneConfig,
    *,
    validation: Sequence[Example] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    checkpoint: EpochCheckpoint | None = None,
) -> FinetuneResult:
    """Fine-tune a copy of ``model`` on ``train`` (the input model is not modified).

    AdamW, constant learning rate, seeded shuffling. With ``validation``, accuracy is measured after
    every epoch and the weights of the best epoch (earliest on ties) are kept; without it, the last.
    ``on_step(step, loss)`` is called after every optimizer step (for progress bars).

    With ``checkpoint``, the state after every epoch (and within an epoch every ``checkpoint.every_s``
    seconds) is saved there, and a state saved by an earlier call with the same model, rows and settings is
    resumed where it was saved (the result is the uninterrupted run's: :mod:`privlm.lm.finetune_checkpoint`,
    which says why such a file is private).
    """
    if not train:
        raise UserError("no training examples to fine-tune on")
    for text, label in train:
        if not 0 <= label < len(label_words):
            raise UserError(f"label {label} of {text[:40]!r} is outside 0..{len(label_words) - 1}")
    model = copy.deepcopy(model).requires_grad_(not config.lora_rank)
    if config.lora_rank:
        lora = LoraConfig(
            r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0, target_modules="all-linear"
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)  # LoRA's A matrices are drawn from the global generator
            model = get_peft_model(model, lora)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    options = [encode_option(tokenizer, t, template, label_words[y], config.max_length) for t, y in train]
    pad = pad_token_id(tokenizer)
    generator = torch.Generator().manual_seed(config.seed)
    result = FinetuneResult(model=model, config=config)
    best_state: list[torch.Tensor] | None = None
    per_epoch = math.ceil(len(options) / config.batch_size)
    step, done_epochs, within = 0, 0, None
    if checkpoint is not None:
        key = checkpoint.key(config, list(train), list(validation or ()), template, list(label_words))
        state = checkpoint.load(key)
        if state is not None:
            done_epochs, best_state, within = state["epoch"], state["best_state"], state.get("within")
            with torch.no_grad():
                for p, saved in zip(params, state["params"], strict=True):
                    p.copy_(saved)
            optimizer.load_state_dict(state["optimizer"])
            generator.set_state(state["generator"])
            torch.set_rng_state(state["torch_rng"])
            result.history = state["history"]
            result.best_epoch, result.validation_accuracy = state["best_epoch"], state["validation_accuracy"]
            step = done_epochs * per_epoch + (0 if within is None else within["next"] // config.batch_size)

    def save(epoch: int, within: dict[str, Any] | None) -> float:
        """Save the state after ``epoch`` whole epochs (and ``within`` the next one); returns when."""
        checkpoint.save(
            {
                "key": key,
                "epoch": epoch,
                "within": within,
                "params": [p.detach() for p in params],
                "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(),
                "torch_rng": torch.get_rng_state(),
                "history": result.history,
                "best_epoch": result.best_epoch,
                "validation_accuracy": result.validation_accuracy,
                "best_state": best_state,
            }
        )
        return time.monotonic()

    saved_at = time.monotonic()
    for epoch in range(done_epochs + 1, config.epochs + 1):
        model.train()
        if within is None:
            order, losses, first = torch.randperm(len(options), generator=generator).tolist(), [], 0
        else:  # resumed within this epoch: its order and losses so far are the saved ones
            order, losses, first, within = within["order"], within["losses"], within["next"], None
        for start in range(first, len(order), config.batch_size):
            batch = collate([options[i] for i in order[start : start + config.batch_size]], pad)
            loss = -option_logprobs(model, batch).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
            following = start + config.batch_size
            if checkpoint is not None and following < len(order) and time.monotonic() - saved_at >= checkpoint.every_s:
                saved_at = save(epoch - 1, {"order": order, "next": following, "losses": losses})
            if on_step is not None:
                on_step(step, losses[-1])
        record = {"epoch": epoch, "train_loss": sum(losses) / len(losses)}
        if validation:
            accuracy = evaluate_accuracy(
                model, tokenizer, validation, template, label_words, max_length=config.max_length
            )
            record["validation_accuracy"] = accuracy.value
            if result.validation_accuracy is None or accuracy.value > result.validation_accuracy:
                result.validation_accuracy, result.best_epoch = accuracy.value, epoch
                best_state = [p.detach().clone() for p in params]
        result.history.append(record)
        if checkpoint is not None:
            saved_at = save(epoch, None)
    if best_state is None:
        result.best_epoch = config.epochs
    else:
        with torch.no_grad():
            for p, saved in zip(params, best_state):
                p.copy_(saved)
    if config.lora_rank:
        model = model.merge_and_unload()
    result.model = model.eval()
    return result


def select_and_finetune(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: Sequence[Example],
    validation: Sequence[Example],
    template: str,
    label_words: Sequence[str],
    grid: Sequence[FinetuneConfig],
    on_step: Callable[[int, float], None] | None = None,
    checkpoint: EpochCheckpoint | None = None,
) -> tuple[FinetuneResult, list[dict[str, object]]]:
    """Fine-tune with every configuration of ``grid``; keep the best on ``validation`` (first on ties).

    Returns the kept result and one row per configuration (its fields and validation accuracy).
    ``on_step`` counts steps across the whole grid. With ``checkpoint``, each configuration keeps its
    own checkpoint (:meth:`EpochCheckpoint.numbered`).
    """
    if not grid or not validation:
        raise UserError("hyperparameter selection needs a non-empty grid and a validation split")
    best: FinetuneResult | None = None
    rows: list[dict[str, object]] = []
    done_steps = 0
    for index, config in enumerate(grid):
        offset_step = None if on_step is None else (lambda step, loss, before=done_steps: on_step(before + step, loss))
        result = finetune_classifier(
            model,
            tokenizer,
            train,
            template,
            label_words,
            config,
            validation=validation,
            on_step=offset_step,
            checkpoint=None if checkpoint is None else checkpoint.numbered(index),
        )
        done_steps += config.epochs * math.ceil(len(train) / config.batch_size)
        rows.append(
            {**asdict(config), "validation_accuracy": result.validation_accuracy, "best_epoch": result.best_epoch}
        )
        if best is None or result.validation_accuracy > best.validation_accuracy:
            best = result
    return best, rows
