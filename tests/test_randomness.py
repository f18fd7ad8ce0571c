"""The secure randomness behind every privacy-relevant draw (:mod:`privlm.randomness`): regression
tests for the audit's 32-bit-seed attack, 53-bit uniforms, the Gaussian's law and reach, addressing,
and the seeded (non-private) streams."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from privlm.errors import UserError
from privlm.privacy.gaussian import gaussian_noise_multiplier
from privlm.privacy.validation import MIN_NOISE_MULTIPLIER, Z_MAX, check_noise_multiplier_for_sampler
from privlm.randomness import KEY_BYTES, RunStreams, SecureRandom, _Keystream, box_muller


def _key(byte: int, value: int) -> bytes:
    key = bytearray(KEY_BYTES)
    key[byte] = value
    return bytes(key)


@pytest.mark.parametrize("byte", [4, 8, 16, 31])
def test_keys_differing_only_above_bit_32_give_different_noise(byte):
    """torch's CPU generator kept only the low 32 bits of a seed; here every key bit matters."""
    low = _key(0, 7)
    high = bytearray(low)
    high[byte] = 1
    a = SecureRandom(low, private=True).normal((64,), (1, 0))
    b = SecureRandom(bytes(high), private=True).normal((64,), (1, 0))
    assert not torch.equal(a, b)
    assert (a != b).float().mean() > 0.9


@pytest.mark.parametrize("length", [0, 8, 16, 31, 33])
def test_keys_must_be_256_bits(length):
    with pytest.raises(ValueError, match="256 bits"):
        SecureRandom(bytes(length), private=True)


def test_os_keys_are_fresh_and_seeded_keys_are_marked_non_private():
    assert SecureRandom.from_os() != SecureRandom.from_os()
    assert SecureRandom.from_os().private
    seeded = SecureRandom.from_seed(3, "noise")
    assert not seeded.private and seeded == SecureRandom.from_seed(3, "noise")
    assert seeded != SecureRandom.from_seed(3, "probes")  # one key per stream
    assert RunStreams.create().private and not RunStreams.create(0).private
    streams = RunStreams.create()
    assert len({streams.sampler, streams.probes, streams.noise}) == 3
    assert RunStreams.from_state(streams.state()) == streams
    assert "key" not in repr(seeded) and seeded.state()["key"] not in repr(seeded)


def test_draws_depend_on_key_and_address_only():
    rng = SecureRandom.from_os()
    first = rng.normal((5, 7), (3, 2))
    rng.normal((1000,), (3, 1))  # other draws in between change nothing
    assert torch.equal(rng.normal((5, 7), (3, 2)), first)
    assert not torch.equal(rng.normal((5, 7), (3, 3)), first)
    assert not torch.equal(rng.normal((5, 7), (4, 2)), first)
    with pytest.raises(ValueError):
        rng.normal((2,), (2**32,))


def test_uniforms_have_53_bit_resolution():
    u = SecureRandom.from_os().uniform(200_000, (9,))
    assert u.dtype == torch.float64 and 0 < float(u.min()) and float(u.max()) <= 1
    m = u * 2.0**53 - 1
    assert torch.equal(m, m.round())  # on the (m + 1)·2⁻⁵³ grid
    low_bits = (m.to(torch.int64) & ((1 << 29) - 1)) != 0  # bits float32 uniforms (24 bits) never set
    assert low_bits.float().mean() > 0.99
    assert abs(float((m.to(torch.int64) & 1).double().mean()) - 0.5) < 0.01  # the last bit is random too


def test_uniforms_are_uniform():
    u = SecureRandom.from_os().uniform(100_000, (1,))
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-4


def test_normals_follow_the_normal_law_in_float64_and_float32():
    rng = SecureRandom.from_seed(11, "test")
    for dtype in (torch.float64, torch.float32):
        z = rng.normal((300_001,), (int(dtype == torch.float32),), dtype=dtype)  # odd size: a half pair
        assert z.dtype == dtype and z.shape == (300_001,)
        assert stats.kstest(z.double().numpy(), "norm").pvalue > 1e-4
        beyond3 = int((z.abs() > 3).sum())
        expected = 300_001 * 2 * stats.norm.sf(3)
        assert abs(beyond3 - expected) < 5 * math.sqrt(expected)


def test_scaled_noise_has_std_and_reaches_past_float32_uniform_limits():
    z = SecureRandom.from_seed(2, "test").normal((200_000,), (0,), std=3.5, dtype=torch.float64)
    assert float(z.std()) == pytest.approx(3.5, rel=0.01)
    # the smallest u₁ the stream can give, 2⁻¹⁰⁶, maps to r = 12.1; float32 uniforms stop at ≈ 5.8
    z = box_muller(torch.tensor([2.0**-106, 2.0**-53], dtype=torch.float64))  # θ = 2π·2⁻⁵³: cos θ = 1
    assert float(z[0]) == pytest.approx(Z_MAX) and Z_MAX == pytest.approx(math.sqrt(212 * math.log(2)))
    assert float(z[0]) > 12


class _ScriptedStream:
    """Stands in for the ChaCha20 encryptor: returns the given 64-bit words in order."""

    def __init__(self, words: list[int]) -> None:
        self.data = b"".join(w.to_bytes(8, "little") for w in words)

    def update(self, zeros: bytes) -> bytes:
        out, self.data = self.data[: len(zeros)], self.data[len(zeros) :]
        return out

    def update_into(self, zeros, buffer) -> None:
        buffer[: len(zeros)] = self.update(bytes(len(zeros)))


def test_a_small_first_word_is_refined_by_the_next_word():
    """u₁ = (m₁ + 1)·2⁻⁵³ normally; m₁ < 2²⁰ takes the next keystream word m₂: (m₁ + (m₂ + 1)·2⁻⁵³)·2⁻⁵³."""
    # pairs (m₁, m₂-for-θ): (0, 0) and (5·2²⁰, 2⁵²); then the refinement word of the first pair: 0
    stream = _Keystream(_ScriptedStream([0, 5 << 20, 0, 1 << 52, 0]), 4)
    z = stream.normals(4)
    assert float(z[0]) == pytest.approx(Z_MAX * math.cos(2 * math.pi * 2.0**-53))  # u₁ = 2⁻¹⁰⁶
    u1 = ((5 << 20) + 1) * 2.0**-53  # not refined
    assert float(z[1]) == pytest.approx(
        math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * ((1 << 52) + 1) * 2.0**-53)
    )
    assert float(z[0]) > 12


def test_noise_multipliers_below_the_sampler_tail_are_refused():
    check_noise_multiplier_for_sampler(0.0)  # noise off: not a private mechanism, allowed
    check_noise_multiplier_for_sampler(MIN_NOISE_MULTIPLIER)
    with pytest.raises(UserError, match="below"):
        check_noise_multiplier_for_sampler(0.1)
    assert stats.norm.sf(Z_MAX - 1 / MIN_NOISE_MULTIPLIER) < 1e-12
    with pytest.raises(UserError, match="below"):
        gaussian_noise_multiplier(60.0, 1e-5)


def test_gradient_noise_is_blocked_and_a_shard_reads_its_slice_of_the_whole_draw(monkeypatch):
    import privlm.randomness as randomness

    rng = SecureRandom.from_seed(3, "noise")
    small = rng.gradient_noise((6, 5), (2, 1), std=0.5, dtype=torch.float64)
    assert torch.equal(small, rng.normal((6, 5), (2, 1), std=0.5, dtype=torch.float64))  # one block: the plain draw
    monkeypatch.setattr(randomness, "NOISE_BLOCK", 7)  # blocks of 7 elements: rows straddle them
    whole = rng.gradient_noise((6, 5), (2, 1), dtype=torch.float64)
    assert torch.equal(whole.flatten()[:7], rng.normal((7,), (2, 1, 0), dtype=torch.float64))
    assert torch.equal(whole.flatten()[28:], rng.normal((2,), (2, 1, 4), dtype=torch.float64))  # the short last block
    for cut in ([0, 3, 6], [0, 1, 2, 4, 6], [0, 6]):  # any sharding of the rows reads the same values
        shards = [rng.gradient_noise((6, 5), (2, 1), rows=(a, b), dtype=torch.float64) for a, b in zip(cut, cut[1:])]
        assert torch.equal(torch.cat(shards), whole)
    assert rng.gradient_noise((6, 5), (2, 1), rows=(3, 3)).shape == (0, 5)
    assert not torch.equal(whole.flatten()[:7], whole.flatten()[7:14])  # distinct blocks, distinct draws
    with pytest.raises(ValueError, match="rows"):
        rng.gradient_noise((6, 5), (2, 1), rows=(4, 7))
