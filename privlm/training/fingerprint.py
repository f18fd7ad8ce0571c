"""Fingerprints that bind a resumed training run to the data and the model it started with.

A resume replays the steps after the last checkpoint with the *same* saved randomness (Poisson batch,
probes, noise). On the same data and the same model that releases nothing new (the replay recomputes
the values the interrupted run computed); on other data or another model it would release a second
value with the same noise, and the difference of the two is noise-free. So every checkpoint's
``meta.json`` stores

- ``data``: SHA-256 of a canonical serialisation of the training rows exactly as the loop reads them
  (after every cut — ``--max-train``, ``--max-length`` truncation, tokenization — in order), and
- ``model``: SHA-256 of the model's configuration and the initial value of every parameter and buffer
  (names, trainable flags, dtypes, shapes, bytes), computed before the first step: for a LoRA run the
  frozen base weights *and* the adapters' initial values,

and :func:`privlm.training.loop.check_run_dir` refuses a resume whose fingerprints differ.

**The data fingerprint is a function of the private data** (whoever holds candidate data sets can test
them against it; it is not differentially private). It belongs in the private run folder, beside the
checkpoints that already hold the noise RNG states, and must never be copied into a released file:
not into ``privacy.json``, the final ``model/``/``adapter/`` folder, ``metrics.jsonl``, a ``--json``
summary, a results table or a README. Error messages name which fingerprint differs, never its value.
The model fingerprint is of public inputs only.

Cost: one pass over the rows (each row's canonical bytes and its collated form) and one SHA-256 over
the parameters, per call: the training loop calls it once when the run has a run folder, and a cached
head-only run fingerprints the model a second time for its feature cache (not timed by a benchmark).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from privlm.dpsgd.sharding import gathered

DATA_TAG = b"privlm-rows-v1\0"
MODEL_TAG = b"privlm-model-v1\0"
# Keys of a model configuration that name where it was loaded from, not what it is.
_LOCATION_KEYS = ("name_or_path", "base_model_name_or_path", "transformers_version", "revision")


class Unserialisable(TypeError):
    """A row holds a value :func:`canonical_bytes` has no canonical form for."""


def canonical_bytes(value: Any) -> bytes:
    """An injective, type-tagged, length-prefixed byte form of ``value`` (None, bool, int, float, str,
    bytes, tensors, NumPy arrays, mappings with string keys, sequences, dataclasses, enums)."""
    out: list[bytes] = []
    _feed(out, value)
    return b"".join(out)


def _length(n: int) -> bytes:
    return struct.pack("<Q", n)


def _feed(out: list[bytes], value: Any) -> None:
    if value is None:
        out.append(b"N")
    elif isinstance(value, bool):
        out.append(b"T" if value else b"F")
    elif isinstance(value, enum.Enum):
        out.append(b"e")
        _feed(out, type(value).__qualname__)
        _feed(out, value.value)
    elif isinstance(value, int):
        text = str(value).encode()
        out += [b"i", _length(len(text)), text]
    elif isinstance(value, float):
        out += [b"f", struct.pack("<d", value)]
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        out += [b"s", _length(len(data)), data]
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        out += [b"y", _length(len(data)), data]
    elif isinstance(value, torch.Tensor):
        _feed_array(out, b"t", str(value.dtype), tuple(value.shape), _flat_bytes(value).tobytes())
    elif isinstance(value, np.ndarray):
        _feed_array(out, b"a", str(value.dtype), value.shape, np.ascontiguousarray(value).tobytes())
    elif isinstance(value, np.generic):
        _feed(out, value.item())
    elif isinstance(value, Mapping):
        items = list(value.items())
        if not all(isinstance(k, str) for k, _ in items):
            raise Unserialisable("mapping with non-string keys")
        out += [b"m", _length(len(items))]
        for key, item in sorted(items, key=lambda kv: kv[0]):
            _feed(out, key)
            _feed(out, item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
        out += [b"d", _length(len(names))]
        _feed(out, type(value).__qualname__)
        for name in names:
            _feed(out, name)
            _feed(out, getattr(value, name))
    elif isinstance(value, (list, tuple)):
        out += [b"l", _length(len(value))]
        for item in value:
            _feed(out, item)
    else:
        raise Unserialisable(f"no canonical form for {type(value).__qualname__}")


def _feed_array(out: list[bytes], tag: bytes, dtype: str, shape: tuple[int, ...], data: bytes) -> None:
    out.append(tag)
    _feed(out, dtype)
    _feed(out, list(shape))
    out += [_length(len(data)), data]


def _flat_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, flattened, without a copy beyond the move to contiguous CPU memory."""
    flat = gathered(tensor).reshape(-1).contiguous().cpu()  # a sharded (FSDP2) tensor whole: a collective
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def data_fingerprint(rows: Sequence[Any], collate: Callable[[list], Any] | None = None) -> str:
    """SHA-256 (hex) of the training rows in order: each row's canonical bytes (when it has a canonical
    form) and those of ``collate([row])``, the model input it becomes (when ``collate`` is given), so a
    library caller whose collate tokenizes text rows binds the tokenizer, length cut and template too.

    PRIVATE: a function of the private data; keep it in the run folder, never in a released file."""
    digest = hashlib.sha256(DATA_TAG)
    digest.update(_length(len(rows)))
    for row in rows:
        try:
            data = b"r" + canonical_bytes(row)
        except Unserialisable:
            if collate is None:
                raise
            data = b""
        if collate is not None:
            data += b"c" + canonical_bytes(collate([row]))
        digest.update(_length(len(data)))
        digest.update(data)
    return digest.hexdigest()


def _public_config(value: Any) -> Any:
    """A JSON-able, deterministic form of a model/adapter configuration, without where it was loaded from."""
    if hasattr(value, "to_dict") and not isinstance(value, Mapping):
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {
            str(k): _public_config(v)
            for k, v in value.items()
            if not str(k).startswith("_") and str(k) not in _LOCATION_KEYS
        }
    if isinstance(value, (set, frozenset)):
        return sorted((_public_config(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (list, tuple)):
        return [_public_config(v) for v in value]
    if isinstance(value, enum.Enum):
        return _public_config(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _public_config(dataclasses.asdict(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return str(value)
    return f"<{type(value).__qualname__}>"  # never a repr with a memory address


def model_fingerprint(module: nn.Module) -> str:
    """SHA-256 (hex) of ``module``'s configuration (``config``, ``peft_config``; load paths dropped) and of
    every parameter (name, trainable flag, dtype, shape, bytes) and buffer, as they are now — call it
    before the first step."""
    digest = hashlib.sha256(MODEL_TAG)
    config = {"class": type(module).__qualname__}
    for attribute in ("config", "peft_config"):
        value = getattr(module, attribute, None)
        if value is not None:
            config[attribute] = _public_config(value)
    text = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    digest.update(_length(len(text)))
    digest.update(text)
    for kind, named in ((b"p", module.named_parameters()), (b"b", module.named_buffers())):
        for name, tensor in sorted(named, key=lambda item: item[0]):
            header = canonical_bytes([name, bool(tensor.requires_grad), str(tensor.dtype), list(tensor.shape)])
            digest.update(kind + _length(len(header)) + header)
            data = _flat_bytes(tensor)
            digest.update(_length(data.nbytes))
            digest.update(data)
    return digest.hexdigest()


def fingerprints(
    module: nn.Module, rows: Sequence[Any], collate: Callable[[list], Any] | None = None
) -> dict[str, str]:
    """``{"data": ..., "model": ...}`` for a checkpoint's ``meta.json`` (private: see module docstring)."""
    return {"data": data_fingerprint(rows, collate), "model": model_fingerprint(module)}
