"""The frozen prefix's activations, computed once per example and kept with the run.

In a head-only run (:mod:`privlm.training.head`) everything below the trained rows is frozen, so each
example's final hidden state h at the label position is the same in every epoch. :func:`load_or_build`
computes h once for every training and test example (forward passes of the frozen model, no graph),
stores it in a compact dtype (``bfloat16`` by default: d values per example, 1.2 KB for SmolLM2), and
every epoch then runs through the head only.

The same machinery caches any other frozen computation, described by a :class:`FrozenPass` (what it
computes, the model it is bound to, the vectors it gives per example) and built by :func:`load_or_build_pass`:
``--train-layers N`` (:mod:`privlm.training.top_blocks`) caches the hidden states entering decoder block
L−N at every token of each training example — a *ragged* cache, ``n_i`` vectors for example i, stored
concatenated with their counts.

**The cache is private.** h is a function of the private text (a deterministic one, of public weights),
so the cache folder is protected like the data: it lives in the run folder (or another private folder),
never in a results folder or a release, and its ``meta.json`` holds the data fingerprint
(:mod:`privlm.training.fingerprint`). It is **bound to its inputs**: ``meta.json`` records the
fingerprints of the encoded training and test rows, of the model (configuration and every weight) and
the layout (dtype, what is cached, the batch shapes); a cache whose fingerprints differ from the run's is
refused (exit 2, naming which differs), never silently reused or rebuilt.

**Each row depends on its own example only, bitwise.** A model's output for one row can change in its
last bits with the shape of the batch it is computed in, so batching rows by length would let one added
example move others into batches of another width and change their features. :func:`compute_features`
instead runs every row in a batch of ``BATCH_ROWS`` rows × the width of the public ladder
(:func:`privlm.resources.padding.shape_buckets`, capped at the run's ``max_length``) that holds it, with
at least one filler row: h_i (and its cast to the cache dtype) is a function of example i, the public
weights and those public constants alone — on a given machine and software stack, the same bits
whatever the other rows, their number or order, and whichever chunk of the resumable build holds row i (``tests/training/test_prefix_cache.py``).
So each training row (h_i, y_i) depends on example i only, and the DP guarantee, the resume binding
and the ledger are those of DP-SGD on the fixed rows (h_i, y_i) — up to the rounding of DP-SGD's own
micro-batches, quantified in :mod:`privlm.training.data`. The uncached head-only run computes h inside
those micro-batches instead (other batch shapes), so cached and uncached runs agree to rounding, not
bitwise.

Written atomically (temporary folder, ``os.replace``): a cache folder is complete or absent. The build
itself goes chunk by chunk through a private ``.<name>.partial`` folder beside it (bound to the same key),
so a build killed after hours resumes at its last finished chunk.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from privlm.atomic import write_text_atomic
from privlm.errors import UserError
from privlm.lm.prompts import EncodedOption, collate
from privlm.resources.padding import WIDTH_STEP, shape_buckets
from privlm.training.fingerprint import data_fingerprint, model_fingerprint
from privlm.training.head import LabelWordHead

LAYOUT = "final hidden state at the position predicting the first label-word token (privlm-head-v2)"
CHUNK_ORDER = "length"  # the rows of a resumable build's chunks: in order of length (_build_in_chunks)
BATCH_ROWS = 8  # rows of every batch of the feature pass (at most BATCH_ROWS - 1 examples and a filler row)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


OnRows = Callable[[int], None]
"""``on_rows(n)``: n more examples are done (progress; never their contents)."""


@dataclass(frozen=True)
class Features:
    """Cached features: ``train`` (N, d) and ``test`` (M, d) in the cache dtype, rows in split order;
    ``build_s``: seconds this process spent building them (None: read from an existing cache). A ragged
    cache (:class:`FrozenPass` with counts) holds ``train_counts[i]`` consecutive vectors of ``train`` for
    example i (:meth:`rows`), and the same for ``test``."""

    train: Tensor
    test: Tensor
    build_s: float | None = None
    train_counts: Tensor | None = None
    test_counts: Tensor | None = None

    def rows(self, split: str = "train") -> list[Tensor]:
        """Each example's cached vectors (views, in split order): (n_i, d) for a ragged cache, (d,) otherwise."""
        values, counts = (self.train, self.train_counts) if split == "train" else (self.test, self.test_counts)
        if counts is None:
            return list(values)
        return list(torch.split(values, [int(n) for n in counts]))


@dataclass(frozen=True)
class FrozenPass:
    """A frozen computation cached once per example: ``layout`` says what it computes (public; part of the
    cache's key, with the batch shapes and the dtype), ``module`` is the model whose fingerprint binds the
    cache, ``width`` is d, and ``compute(rows, on_rows)`` returns ``(values, counts)`` for ``rows`` in order:
    ``counts`` None — one d-vector per row, ``values`` (len(rows), d) — or ``counts[i]`` vectors for row i,
    concatenated in ``values``. Each row's vectors must be a function of that row alone (fixed public batch
    shapes, :func:`~privlm.resources.padding.shape_buckets`), and ``on_rows(n)`` is called as rows are done."""

    layout: str
    module: nn.Module
    width: int
    compute: Callable[[Sequence[Any], OnRows | None], tuple[Tensor, Tensor | None]]


def compute_features(
    head: LabelWordHead,
    rows: Sequence[EncodedOption],
    pad_id: int,
    max_length: int,
    batch_size: int = BATCH_ROWS,
    on_rows: OnRows | None = None,
) -> Tensor:
    """h (len(rows), d) of every row, in row order, in the dtype of the head's rows.

    Row i is computed in a batch of exactly ``batch_size`` rows × ``min(max_length, WIDTH_STEP·⌈len_i/WIDTH_STEP⌉)``
    tokens, padded with ``pad_id`` and at least one filler row (:func:`~privlm.resources.padding.shape_buckets`),
    so h_i does not depend on the other rows (bitwise). ``max_length`` must be a public bound on every row's
    length — the run's ``max_length`` the rows were encoded with, never one read off the rows; a longer
    row is a ``ValueError``. ``on_rows(n)`` after each batch of n examples."""
    out = torch.empty(len(rows), head.rows.in_features, dtype=head.rows.weight.dtype)
    for indices, width in shape_buckets([len(r.input_ids) for r in rows], batch_size, max_length):
        batch = collate([rows[i] for i in indices], pad_id, width=width, rows=batch_size)
        out[indices] = head.features(batch, len(indices))
        if on_rows is not None:
            on_rows(len(indices))
    return out


def head_pass(head: LabelWordHead, pad_id: int, max_length: int) -> FrozenPass:
    """The head-only cache as a :class:`FrozenPass`: :func:`compute_features`, one vector per example."""

    def compute(rows: Sequence[EncodedOption], on_rows: OnRows | None) -> tuple[Tensor, None]:
        return compute_features(head, rows, pad_id, max_length, on_rows=on_rows), None

    return FrozenPass(LAYOUT, head, head.rows.in_features, compute)


def _key(frozen: FrozenPass, train: Sequence[Any], test: Sequence[Any], dtype: str, max_length: int) -> dict[str, str]:
    shapes = f"batches of {BATCH_ROWS} rows x widths {WIDTH_STEP}, {2 * WIDTH_STEP}, ... up to {max_length}"
    return {
        "train": data_fingerprint(train),
        "test": data_fingerprint(test),
        "model": model_fingerprint(frozen.module),
        "layout": f"{frozen.layout}; {shapes}; {dtype}",
    }


_WHAT = {
    "train": "other training rows",
    "test": "other test rows",
    "model": "another model or label words",
    "layout": "another cache layout or dtype",
}


def load_or_build(
    cache_dir: Path,
    head: LabelWordHead,
    train: Sequence[EncodedOption],
    test: Sequence[EncodedOption],
    pad_id: int,
    max_length: int,
    dtype: str = "bfloat16",
    on_build: Callable[[int], None] | None = None,
    chunk: int = 128,
    on_rows: OnRows | None = None,
) -> Features:
    """The features of ``train`` and ``test`` from ``cache_dir`` (built there first if absent).

    ``pad_id`` and ``max_length`` (the public bound the rows were encoded with) are those of
    :func:`compute_features`. Refuses (UserError) a cache built for other rows, another model or another
    layout (another ``max_length`` included). ``on_build(n)`` is
    called before a build of n examples (progress reporting), ``on_rows(n)`` as n more are done. A build
    writes ``chunk`` examples at a time into ``.<cache_dir name>.partial/`` beside the cache (same key,
    checked the same way), so a killed build resumes at its last finished chunk; the partial folder is
    removed once the cache is complete (:func:`load_or_build_pass`)."""
    return load_or_build_pass(
        cache_dir, head_pass(head, pad_id, max_length), train, test, max_length, dtype, on_build, chunk, on_rows
    )


def load_or_build_pass(
    cache_dir: Path,
    frozen: FrozenPass,
    train: Sequence[Any],
    test: Sequence[Any],
    max_length: int,
    dtype: str = "bfloat16",
    on_build: Callable[[int], None] | None = None,
    chunk: int = 128,
    on_rows: OnRows | None = None,
) -> Features:
    """``frozen``'s cached vectors of ``train`` and ``test`` from ``cache_dir``, built there first if absent
    (chunk by chunk, resumable; :func:`load_or_build`). Refuses (UserError) a cache or partial build whose key
    — fingerprints of the rows and of ``frozen.module``, the layout with ``max_length`` and ``dtype`` — differs."""
    if dtype not in DTYPES:
        raise UserError(f"cache dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    key = _key(frozen, train, test, dtype, max_length)
    meta_path = cache_dir / "meta.json"
    if meta_path.exists():
        _check_key(
            json.loads(meta_path.read_text(encoding="utf-8")).get("key", {}), key, f"the feature cache {cache_dir}"
        )
        tensors = load_file(str(cache_dir / "features.safetensors"))
        return Features(
            tensors["train"], tensors["test"], None, tensors.get("train_counts"), tensors.get("test_counts")
        )
    if on_build is not None:
        on_build(len(train) + len(test))
    start = time.perf_counter()
    partial = cache_dir.parent / f".{cache_dir.name}.partial"
    _check_partial(partial, key)
    (train_values, train_counts), (test_values, test_counts) = (
        _build_in_chunks(partial, split, frozen, rows, DTYPES[dtype], chunk, on_rows)
        for split, rows in (("train", train), ("test", test))
    )
    features = Features(train_values, test_values, time.perf_counter() - start, train_counts, test_counts)
    _write(cache_dir, features, key)
    shutil.rmtree(partial, ignore_errors=True)
    return features


def _check_key(saved: dict, key: dict[str, str], what: str) -> None:
    """Refuse a cache whose saved key differs from ``key`` (names what differs, never a fingerprint)."""
    differing = [_WHAT[k] for k in _WHAT if saved.get(k) != key[k]]
    if differing:
        raise UserError(
            f"{what} was built for {', '.join(differing)}; it is not reused: delete it or choose another cache folder"
        )


def _check_partial(partial: Path, key: dict[str, str]) -> None:
    """Create the partial-build folder with its key, or check the key of the one a killed build left."""
    key_path = partial / "key.json"
    if key_path.exists():
        saved = json.loads(key_path.read_text(encoding="utf-8"))
        _check_key(saved, key, f"the partial feature cache {partial}")
        if saved.get("chunk_order") != CHUNK_ORDER:  # its chunks hold other rows than this build's would
            raise UserError(f"the partial feature cache {partial} was cut into chunks by an older privlm: delete it")
        return
    partial.mkdir(parents=True, exist_ok=True)
    write_text_atomic(key_path, json.dumps({**key, "chunk_order": CHUNK_ORDER}, indent=2, sort_keys=True) + "\n")


def _build_in_chunks(
    partial: Path,
    split: str,
    frozen: FrozenPass,
    rows: Sequence[Any],
    dtype: torch.dtype,
    chunk: int,
    on_rows: OnRows | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``frozen``'s vectors of ``rows`` in ``dtype`` (and their counts, for a ragged pass), in row order,
    computed ``chunk`` rows at a time in order of length (so that a chunk's rows share few of the public
    batch widths and few filler rows are computed; each row's batch shape is still a function of its own
    length, so its vectors are the same in any chunk); each finished chunk is saved atomically under
    ``partial`` and read back instead of recomputed. The order is a function of the rows alone, so a resumed
    build cuts the same chunks."""
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i].input_ids), i))
    pieces: list[Tensor | None] = [None] * len(rows)
    ragged = False
    for number, begin in enumerate(range(0, len(rows), chunk)):
        members = order[begin : begin + chunk]
        path = partial / f"{split}-{number:06d}.safetensors"
        if path.exists():
            saved = load_file(str(path))
            part, count = saved["features"], saved.get("counts")
            if on_rows is not None:
                on_rows(len(members))
        else:
            values, count = frozen.compute([rows[i] for i in members], on_rows)
            part = values.to(dtype).contiguous()
            tmp = path.with_suffix(".tmp")
            save_file({"features": part} | ({} if count is None else {"counts": count.contiguous()}), str(tmp))
            os.replace(tmp, path)
        ragged = count is not None
        sizes = [1] * len(members) if count is None else count.tolist()
        for i, piece in zip(members, part.split(sizes)):
            pieces[i] = piece
    if not rows:
        return torch.zeros(0, frozen.width, dtype=dtype), None
    done = [piece for piece in pieces if piece is not None]
    counts = torch.tensor([len(piece) for piece in done], dtype=torch.long) if ragged else None
    return torch.cat(done), counts


def _write(cache_dir: Path, features: Features, key: dict[str, str]) -> None:
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    if cache_dir.exists() and any(cache_dir.iterdir()):
        raise UserError(f"{cache_dir} exists and is not a feature cache; choose another cache folder")
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.", dir=cache_dir.parent))
    tensors = {"train": features.train, "test": features.test}
    for name in ("train_counts", "test_counts"):
        if getattr(features, name) is not None:
            tensors[name] = getattr(features, name)
    try:
        save_file(tensors, str(tmp / "features.safetensors"))
        meta = {
            "key": key,
            "n_train": len(features.rows("train")),
            "n_test": len(features.rows("test")),
            "note": "PRIVATE: features and fingerprints of the private data; never copy into a release",
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        if cache_dir.exists():
            cache_dir.rmdir()
        os.replace(tmp, cache_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def cached_rows(features: Tensor, classes: Sequence[int]) -> list[tuple[Tensor, int]]:
    """Training rows of a cached run: (h_i, y_i) per example."""
    return [(features[i], int(y)) for i, y in enumerate(classes)]


def collate_cached(rows: Sequence[tuple[Tensor, int]]) -> dict[str, Tensor]:
    """``{"features": (B, d), "classes": (B,)}``."""
    return {
        "features": torch.stack([h for h, _ in rows]),
        "classes": torch.tensor([y for _, y in rows], dtype=torch.long),
    }
