"""ChaCha20 (RFC 8439) and the secure Gaussians of :mod:`privlm.randomness`, in torch tensor ops on any device.

:class:`privlm.randomness.SecureRandom` draws on the CPU through OpenSSL. On an accelerator that would
cost a CPU pass over every noise value plus a host-to-device copy per step; this module computes the
*same* keystream where the noise is used: 16 × n uint32 words for n blocks held in int64 lanes (every
addition masked to 32 bits, rotations by shifts), 20 rounds, the input added back, serialised little
endian — bitwise the OpenSSL keystream for the same key, nonce and block counter (tested over random keys,
addresses and start offsets). On it sit the same 53-bit uniforms and the same float64 Box–Muller with the
same tail refinement as :class:`privlm.randomness._Keystream`, chunk by chunk, so a draw reads the same
keystream words in the same order on every device: on the CPU the Gaussians are bitwise those of
``SecureRandom.normal``; on a GPU ``log``/``sin``/``cos`` may differ from the CPU's in the last ulp of
float64 (far below the float32 they are cast to), which changes no probability the accountant relies on.

A refinement word (first uniform below 2⁻³³, probability 2⁻³³ per pair: about one step in 17 for a 1 B
parameter model) shifts every later chunk by one word. Chunks are generated in bulk assuming no
refinement; the rare chunk that needs one is finished exactly and the rest regenerated from the shifted
offset, so the result never depends on that assumption.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence

import torch

_M32 = 0xFFFFFFFF
_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
_DIAGONAL = ((0, 1, 2, 3), (5, 6, 7, 4), (10, 11, 8, 9), (15, 12, 13, 14))
_MANTISSA = (1 << 53) - 1
_REFINE_BELOW = 2**20  # a first word below this is refined by the next keystream word (u₁ < 2⁻³³)
CHUNK = 1 << 16  # Gaussians per chunk: privlm.randomness._CHUNK, which fixes where refinement words sit
SUPER_CHUNK = 64  # chunks generated in one bulk call (2²² Gaussians: 64 MiB of int64 words)


def _rotl(v: torch.Tensor, r: int) -> torch.Tensor:
    return ((v << r) | (v >> (32 - r))) & _M32


def _quarter(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Four quarter rounds at once (rows of (4, n) lanes)."""
    a = (a + b) & _M32
    d = _rotl(d ^ a, 16)
    c = (c + d) & _M32
    b = _rotl(b ^ c, 12)
    a = (a + b) & _M32
    d = _rotl(d ^ a, 8)
    c = (c + d) & _M32
    b = _rotl(b ^ c, 7)
    return a, b, c, d


def key_words(key: bytes) -> tuple[int, ...]:
    """The 256-bit key as eight little-endian uint32 words."""
    if len(key) != 32:
        raise ValueError(f"a ChaCha20 key is 32 bytes, got {len(key)}")
    return tuple(int.from_bytes(key[4 * i : 4 * i + 4], "little") for i in range(8))


def blocks(
    key: Sequence[int], nonce: Sequence[int], first: int, count: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Keystream blocks ``first … first + count − 1`` as (count, 16) uint32 words in int64 lanes.

    ``key``: eight uint32 words; ``nonce``: three uint32 words (RFC 8439's 96-bit nonce); block counters
    must stay below 2³²."""
    if not 0 <= first and first + count <= 2**32:
        raise ValueError(f"block counters must lie in [0, 2^32), got {first}..{first + count - 1}")
    lanes = torch.empty(16, count, dtype=torch.int64, device=device)
    for i, word in enumerate((*_CONSTANTS, *key)):
        lanes[i] = word
    lanes[12] = torch.arange(first, first + count, dtype=torch.int64, device=device)
    for i, word in enumerate(nonce):
        lanes[13 + i] = word
    x = lanes.clone()
    for _ in range(10):
        x[0:4], x[4:8], x[8:12], x[12:16] = _quarter(x[0:4], x[4:8], x[8:12], x[12:16])
        parts = _quarter(*(x[list(rows)] for rows in _DIAGONAL))
        for rows, part in zip(_DIAGONAL, parts):
            x[list(rows)] = part
    return ((x + lanes) & _M32).T


@functools.cache
def _compiled_blocks() -> Callable[..., torch.Tensor]:
    return torch.compile(blocks, dynamic=True)


def block_function(device: torch.device | str) -> Callable[..., torch.Tensor]:
    """:func:`blocks`, fused by ``torch.compile`` on CUDA (one kernel instead of ~500 per call; the
    first call compiles, once per process) unless ``PRIVLM_CHACHA_COMPILE=0``; eager elsewhere. Both give
    the same words (tested bitwise on the CPU)."""
    if torch.device(device).type == "cuda" and os.environ.get("PRIVLM_CHACHA_COMPILE", "1") != "0":
        return _compiled_blocks()
    return blocks


def words53(
    key: Sequence[int],
    nonce: Sequence[int],
    start: int,
    count: int,
    device: torch.device | str = "cpu",
    block_fn: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """64-bit keystream words ``start … start + count − 1`` (8 per block), each cut to its low 53 bits,
    as int64: what :class:`privlm.randomness._Keystream` reads (little-endian int64, masked). ``block_fn``:
    :func:`blocks` or a fused equivalent (default: :func:`block_function` of ``device``)."""
    first, skip = divmod(start, 8)
    n_blocks = (skip + count + 7) // 8
    w = (block_fn or block_function(device))(key, nonce, first, n_blocks, device).reshape(-1, 2)
    low, high = w[:, 0], w[:, 1]
    return (low | ((high & 0x1FFFFF) << 32))[skip : skip + count]


def _box_muller(u: torch.Tensor) -> torch.Tensor:
    """:func:`privlm.randomness.box_muller` (same ops, same order), on ``u``'s device, along its last
    dimension (a row per chunk: several chunks at once)."""
    pairs = u.shape[-1] // 2
    radius = u[..., :pairs].log().mul_(-2.0).sqrt_()
    angle = u[..., pairs:].mul(2 * math.pi)
    return torch.cat((radius * torch.cos(angle), radius * angle.sin_()), dim=-1)


def _chunk_normals(first: torch.Tensor, second: torch.Tensor, refine: torch.Tensor | None, n: int) -> torch.Tensor:
    """One chunk's ``n`` Gaussians from its first-half and second-half words and its refinement words."""
    u1 = first.double().add_(1.0)
    if refine is not None:
        small = (first < _REFINE_BELOW).nonzero().flatten()
        u1[small] += refine.double().add_(1.0).mul_(2.0**-53) - 1.0
    u = torch.cat((u1, second.double().add_(1.0))).mul_(2.0**-53)
    return _box_muller(u)[:n]


def _plain_chunks(block: torch.Tensor) -> torch.Tensor:
    """:func:`_chunk_normals` of several whole chunks at once, none refined: ``block`` (chunks, 2, p) holds each
    chunk's first-half and second-half words; (chunks, 2p) Gaussians, the same elementwise ops in the same
    order (one kernel per op for the lot instead of one per chunk: the GPU path was launch-bound)."""
    return _box_muller(block.double().add_(1.0).mul_(2.0**-53).flatten(1))


def _refine_flags(words: torch.Tensor, pairs: list[int]) -> list[bool]:
    """Per chunk of a group laid out in ``words`` (first halves, then second halves, chunk after chunk):
    whether its first half holds a word that asks for a refinement word. One reduction for the whole chunks
    (all but possibly the draw's last, which is shorter) and one for a shorter last chunk."""
    whole = len(pairs) if pairs[-1] == pairs[0] else len(pairs) - 1
    p = pairs[0]
    flags = (words[: 2 * p * whole].view(whole, 2, p)[:, 0] < _REFINE_BELOW).any(1)
    if whole < len(pairs):
        tail = words[2 * p * whole : 2 * p * whole + pairs[-1]]
        flags = torch.cat((flags, (tail < _REFINE_BELOW).any().view(1)))
    return [bool(f) for f in flags.tolist()]


def normals(
    key: bytes,
    address: Sequence[int],
    n: int,
    device: torch.device | str = "cpu",
    chunk: int = CHUNK,
    block_fn: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """``n`` float64 standard normals of draw ``address`` under ``key``, computed on ``device``: the values
    ``SecureRandom(key).normal((n,), address, dtype=float64)`` gives (module docstring). ``chunk`` must be
    :data:`CHUNK` for that equality (tests shrink both); ``block_fn`` as in :func:`words53`."""
    if len(address) > 3 or any(not 0 <= int(a) < 2**32 for a in address):
        raise ValueError(f"an address is at most three integers in [0, 2^32), got {tuple(address)}")
    kw, nonce = key_words(key), [int(a) for a in address] + [0] * (3 - len(address))
    sizes = [min(chunk, n - s) for s in range(0, n, chunk)]
    out = torch.empty(n, dtype=torch.float64, device=device)
    offset = done = index = 0
    while index < len(sizes):
        group = sizes[index : index + SUPER_CHUNK]
        pairs = [(s + 1) // 2 for s in group]
        words = words53(kw, nonce, offset, 2 * sum(pairs), device, block_fn)
        starts = [0]
        for p in pairs:
            starts.append(starts[-1] + 2 * p)
        firsts = [words[s : s + p] for s, p in zip(starts, pairs)]
        flags = _refine_flags(words, pairs)
        stop = flags.index(True) + 1 if True in flags else len(group)
        j = 0
        while j < stop:
            run = 0  # whole, unrefined chunks from j on: computed together
            while j + run < stop and not flags[j + run] and group[j + run] == 2 * pairs[j + run] == 2 * pairs[j]:
                run += 1
            if run:
                block = words[starts[j] : starts[j + run]].view(run, 2, pairs[j])
                out[done : done + run * group[j]].view(run, group[j]).copy_(_plain_chunks(block))
                done += run * group[j]
                j += run
                continue
            first, second = firsts[j], words[starts[j] + pairs[j] : starts[j + 1]]
            refine = None
            if flags[j]:
                extra = int((first < _REFINE_BELOW).sum())
                refine = words53(kw, nonce, offset + starts[j + 1], extra, device, block_fn)
            out[done : done + group[j]] = _chunk_normals(first, second, refine, group[j])
            done += group[j]
            j += 1
        offset += starts[stop] + (int((firsts[stop - 1] < _REFINE_BELOW).sum()) if flags[stop - 1] else 0)
        index += stop
    return out
