"""Secret randomness for every privacy-relevant draw: DP noise, Poisson sampling, trace-estimator probes.

A :class:`SecureRandom` is a 256-bit key and nothing else. Every draw is *addressed*: the bytes of
draw ``address = (a, b, c)`` (three integers < 2³²) are the ChaCha20 keystream (RFC 8439, OpenSSL
through the ``cryptography`` package) under the key with the 96-bit nonce ``a‖b‖c``, from block 0.
So a draw depends on the key and its address only — not on how many draws came before — which makes
resume exact (the key and the step are the whole state), lets every rank of a distributed run draw the
same probes or noise without any shared counter, and means one empty micro-batch or rank cannot shift
later draws. One address serves at most 2³² ChaCha20 blocks (256 GiB); callers give every distinct
draw of one key a distinct address (the step and a parameter index, see the call sites).

Threat model (README, "Threat model and randomness"): the attacker sees every release (weights, DP
losses, GRADMM targets, synthetic text, ledgers) and knows the code, the public model and every other
example; the key never leaves the process that drew it except inside a run folder's checkpoints, which
are as secret as the data. Under that model:

- **Keys**: 32 bytes from ``os.urandom`` (the kernel CSPRNG), one independent key per stream
  (sampler, probes, noise, each GRADMM release); none is derived from another or from a user seed.
  Predicting a draw without the key is breaking ChaCha20.
- **Uniforms** have 53 bits: ``u = (m + 1)·2⁻⁵³`` for a uniform 53-bit integer ``m`` (exact in float64),
  so ``0 < u ≤ 1``.
- **Gaussians** are computed in float64 by the Box–Muller transform r = √(−2 ln u₁), θ = 2π u₂, with u₂
  such a uniform and u₁ too, except that u₁ < 2⁻³³ is refined by a second word to
  (m₁ + (m₂ + 1)·2⁻⁵³)·2⁻⁵³, so that u₁ reaches 2⁻¹⁰⁶ and ``|z|`` reaches √(212 ln 2) = 12.1
  (:data:`privlm.privacy.validation.Z_MAX`; ≈ 5.8 with float32 uniforms), then scaled and cast. The
  truncated tail matters for privacy as P(Z > Z_MAX − Δ/(σC)) per release and coordinate: below 10⁻¹²
  for σ ≥ 0.2 (Δ = C), and :func:`privlm.privacy.validation.check_noise_multiplier_for_sampler` refuses
  smaller σ.
- **Floating-point attacks** (Mironov 2012; Haney et al. 2022 for Gaussians) read the low-order bits of
  a float output ``fl(x + noise)``; they are *not* prevented here but by snapping what is released
  (:mod:`privlm.privacy.snapping`: GRADMM releases, DP losses). DP-SGD's noisy gradient is not snapped
  and not released itself, only the weights after the optimizer (README, the stated assumption).

``--seed`` (reproducible experiments) builds keys by SHA-256 of the seed and the stream name: whoever
knows the seed can regenerate the noise, so such a stream has ``private == False`` and every output it
touches says ``"private_release": false``.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms

KEY_BYTES = 32
_CHUNK = 1 << 16  # values per keystream chunk: 512 KiB buffers stay in cache (measured faster than 2**18, 2**20)
_MANTISSA = (1 << 53) - 1
_MAX_WORDS = 2**32 * 64 // 8  # one address: 2³² ChaCha20 blocks of 64 bytes
_REFINE_BELOW = 2.0**20  # first words below this get a second word (u₁ < 2⁻³³)
_TWO_PI = 2 * math.pi
NOISE_BLOCK = 1 << 20  # elements per addressed block of a parameter's gradient noise (SecureRandom.gradient_noise)


class SecureRandom:
    """Addressed draws under one 256-bit ChaCha20 key (see module docstring).

    ``private``: False when the key was derived from a user seed (the draws are then reproducible by
    anyone who knows the seed, and nothing they protect is a private release)."""

    def __init__(self, key: bytes, *, private: bool) -> None:
        if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
            raise ValueError(
                f"a key must be {KEY_BYTES} bytes (256 bits), got {len(key) if isinstance(key, (bytes, bytearray)) else type(key).__name__}"
            )
        self._key = bytes(key)
        self.private = private

    @classmethod
    def from_os(cls) -> SecureRandom:
        """A fresh key from ``os.urandom``: the only way to make a stream for a private release."""
        return cls(os.urandom(KEY_BYTES), private=True)

    @classmethod
    def from_seed(cls, seed: int, stream: str) -> SecureRandom:
        """A reproducible, *non-private* stream: key = SHA-256(seed, stream name)."""
        key = hashlib.sha256(f"privlm-seeded-stream\0{int(seed)}\0{stream}".encode()).digest()
        return cls(key, private=False)

    def __repr__(self) -> str:  # never print the key
        return f"SecureRandom(private={self.private})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecureRandom) and other._key == self._key and other.private == self.private

    def __hash__(self) -> int:
        return hash(self._key)

    def state(self) -> dict[str, Any]:
        """The whole state (the key, so: secret) for a checkpoint."""
        return {"key": self._key.hex(), "private": self.private}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SecureRandom:
        """Inverse of :meth:`state`."""
        return cls(bytes.fromhex(state["key"]), private=bool(state["private"]))

    def key_tensor(self) -> torch.Tensor:
        """The key as a (32,) uint8 tensor (to broadcast from rank 0)."""
        return torch.frombuffer(bytearray(self._key), dtype=torch.uint8).clone()

    @classmethod
    def from_key_tensor(cls, tensor: torch.Tensor, *, private: bool) -> SecureRandom:
        """Inverse of :meth:`key_tensor`."""
        return cls(bytes(tensor.to(torch.uint8).cpu().tolist()), private=private)

    def _keystream(self, address: Sequence[int], words: int) -> _Keystream:
        """The keystream of draw ``address``, read as 53-bit words, ``words`` in all."""
        if len(address) > 3 or any(not 0 <= int(a) < 2**32 for a in address):
            raise ValueError(f"an address is at most three integers in [0, 2^32), got {tuple(address)}")
        if words > _MAX_WORDS:
            raise ValueError(f"one draw reads at most {_MAX_WORDS} words (2^32 ChaCha20 blocks), asked {words}")
        parts = [int(a) for a in address] + [0] * (3 - len(address))
        nonce = (0).to_bytes(4, "little") + b"".join(w.to_bytes(4, "little") for w in parts)
        return _Keystream(Cipher(algorithms.ChaCha20(self._key, nonce), mode=None).encryptor(), words)

    def uniform(self, n: int, address: Sequence[int]) -> torch.Tensor:
        """``n`` float64 uniforms ``(m + 1)·2⁻⁵³`` in (0, 1], ``m`` a uniform 53-bit integer."""
        out = torch.empty(n, dtype=torch.float64)
        stream = self._keystream(address, n)
        for start in range(0, n, _CHUNK):
            stop = min(n, start + _CHUNK)
            out[start:stop] = stream.words(stop - start).add_(1.0).mul_(2.0**-53)
        return out

    def normal(
        self,
        shape: Sequence[int] | torch.Size,
        address: Sequence[int],
        *,
        std: float = 1.0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """N(0, std²) entries of ``shape``: float64 Box–Muller (module docstring), scaled, then cast.

        On a CUDA ``device`` the keystream and the Gaussians are computed there (:mod:`privlm.chacha`: the
        same keystream words, bitwise; no host-to-device copy of the noise); elsewhere through OpenSSL."""
        shape = torch.Size(shape)
        n = shape.numel()
        if torch.device(device).type == "cuda":
            from privlm.chacha import normals

            return normals(self._key, address, n, device).mul_(std).to(dtype).reshape(shape)
        out = torch.empty(n, dtype=dtype)
        stream = self._keystream(address, 2 * ((n + 1) // 2))
        for start in range(0, n, _CHUNK):
            stop = min(n, start + _CHUNK)
            out[start:stop] = stream.normals(stop - start).mul_(std)
        return out.reshape(shape).to(device)

    def gradient_noise(
        self,
        shape: Sequence[int] | torch.Size,
        address: tuple[int, int],
        *,
        rows: tuple[int, int] | None = None,
        std: float = 1.0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> torch.Tensor:
        """The N(0, std²) noise of a parameter of ``shape`` at ``address = (step, parameter)``, or only
        its rows ``rows = (start, stop)`` of dimension 0 (a shard): shape ``(stop − start, *shape[1:])``.

        The flattened noise is cut into blocks of :data:`NOISE_BLOCK` elements and block ``b`` is the draw
        at ``(step, parameter, b)``, so a shard draws only the blocks its rows overlap (at most one block
        on either side is shared with a neighbouring shard, each using its own elements), and every shard
        of any number of ranks reads exactly its slice of the one-process draw. A parameter of at most
        :data:`NOISE_BLOCK` elements gets :meth:`normal` at ``(step, parameter)`` itself (block 0)."""
        shape = torch.Size(shape)
        if len(address) != 2:
            raise ValueError(f"a gradient-noise address is (step, parameter), got {tuple(address)}")
        total = shape[0] if shape else 1  # a scalar is one row of one element
        first, last = (0, total) if rows is None else rows
        if not 0 <= first <= last <= total:
            raise ValueError(f"rows {rows} are not within the {total} rows of {tuple(shape)}")
        width, n = shape[1:].numel(), shape.numel()
        start, stop = first * width, last * width
        parts = []
        for block in range(start // NOISE_BLOCK, -(-stop // NOISE_BLOCK)):
            lo = block * NOISE_BLOCK
            drawn = self.normal((min(NOISE_BLOCK, n - lo),), (*address, block), std=std, dtype=dtype, device=device)
            parts.append(drawn[max(start, lo) - lo : min(stop, lo + NOISE_BLOCK) - lo])
        if len(parts) == 1:  # one block (every parameter up to NOISE_BLOCK elements): no copy
            flat = parts[0]
        else:
            flat = torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=device)
        return flat.reshape((last - first, *shape[1:]) if shape else ())


class _Keystream:
    """Consecutive chunks of one draw's keystream as 53-bit words, through reused buffers."""

    def __init__(self, encryptor: CipherContext, words: int) -> None:
        size = max(2, min(words, _CHUNK + 1))  # the most words one chunk asks for
        self.encryptor = encryptor
        self._zeros = bytearray(8 * size)
        self._bytes = bytearray(8 * size)
        self._raw = torch.frombuffer(self._bytes, dtype=torch.int64)
        self._words = torch.empty(size, dtype=torch.float64)

    def words(self, n: int) -> torch.Tensor:
        """The next ``n`` keystream words, each cut to 53 bits, as exact float64 integers in [0, 2⁵³) (a
        view into a buffer that the next call overwrites)."""
        self.encryptor.update_into(memoryview(self._zeros)[: 8 * n], self._bytes)
        return self._words[:n].copy_(self._raw[:n].bitwise_and_(_MANTISSA))

    def normals(self, n: int) -> torch.Tensor:
        """``n ≤ _CHUNK`` float64 standard normals by Box–Muller: per pair u₂ = (m + 1)·2⁻⁵³ and
        u₁ = (m₁ + 1)·2⁻⁵³, except that a small first word (m₁ < 2²⁰, probability 2⁻³³) is refined by a
        further word m₂ to u₁ = (m₁ + (m₂ + 1)·2⁻⁵³)·2⁻⁵³, so that u₁ reaches 2⁻¹⁰⁶ (the extra words come
        next in the keystream, so the draw stays a function of key and address)."""
        pairs = (n + 1) // 2
        u = self.words(2 * pairs)
        small = (u[:pairs] < _REFINE_BELOW).nonzero().flatten() if float(u[:pairs].amin()) < _REFINE_BELOW else None
        u.add_(1.0)
        if small is not None:
            raw = torch.frombuffer(bytearray(self.encryptor.update(bytes(8 * small.numel()))), dtype=torch.int64)
            refine = raw.bitwise_and_(_MANTISSA).double().add_(1.0).mul_(2.0**-53)
            u[small] += refine - 1.0
        return box_muller(u.mul_(2.0**-53))[:n]


def box_muller(u: torch.Tensor) -> torch.Tensor:
    """Standard normals from an even number of float64 uniforms in (0, 1], overwritten: with u₁ the first
    half and u₂ the second, (r cos θ, r sin θ) for r = √(−2 ln u₁), θ = 2π u₂."""
    pairs = u.numel() // 2
    radius = u[:pairs].log_().mul_(-2.0).sqrt_()
    angle = u[pairs:].mul_(_TWO_PI)
    z = torch.empty(2 * pairs, dtype=torch.float64)
    torch.mul(radius, torch.cos(angle), out=z[:pairs])
    torch.mul(radius, angle.sin_(), out=z[pairs:])
    return z


STREAMS = ("sampler", "probes", "noise")


@dataclass(frozen=True)
class RunStreams:
    """The three streams of a DP-SGD run, each with its own key: Poisson sampling, probes, noise."""

    sampler: SecureRandom
    probes: SecureRandom
    noise: SecureRandom

    @classmethod
    def create(cls, seed: int | None = None) -> RunStreams:
        """Three independent OS keys (``seed=None``: private), or three keys derived from ``seed``
        (reproducible and *not* private)."""
        if seed is None:
            return cls(*(SecureRandom.from_os() for _ in STREAMS))
        return cls(*(SecureRandom.from_seed(seed, name) for name in STREAMS))

    @property
    def private(self) -> bool:
        """True when every key came from the OS (a private release is possible)."""
        return all(getattr(self, name).private for name in STREAMS)

    def state(self) -> dict[str, dict[str, Any]]:
        """The keys (secret) for a checkpoint."""
        return {name: getattr(self, name).state() for name in STREAMS}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RunStreams:
        """Inverse of :meth:`state`."""
        return cls(*(SecureRandom.from_state(state[name]) for name in STREAMS))
