"""The torch ChaCha20 against OpenSSL, bitwise; its Gaussians against SecureRandom's, bitwise on the CPU."""

from __future__ import annotations

import random

import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from privlm import chacha
from privlm.randomness import SecureRandom


def _openssl_words(key: bytes, nonce: list[int], start_block: int, n_blocks: int) -> list[int]:
    full = start_block.to_bytes(4, "little") + b"".join(w.to_bytes(4, "little") for w in nonce)
    raw = Cipher(algorithms.ChaCha20(key, full), mode=None).encryptor().update(bytes(64 * n_blocks))
    return [int.from_bytes(raw[4 * i : 4 * i + 4], "little") for i in range(16 * n_blocks)]


@pytest.mark.parametrize("trial", range(6))
def test_keystream_is_openssls_bitwise(trial: int) -> None:
    rng = random.Random(trial)
    key = bytes(rng.getrandbits(8) for _ in range(32))
    nonce = [rng.getrandbits(32) for _ in range(3)]
    start = rng.choice([0, 1, 7, rng.getrandbits(20), 2**32 - 5])
    n_blocks = 4 if start > 2**31 else rng.randint(1, 40)
    got = chacha.blocks(chacha.key_words(key), nonce, start, n_blocks).flatten().tolist()
    assert got == _openssl_words(key, nonce, start, n_blocks)


def test_rfc8439_test_vector() -> None:
    """RFC 8439 §2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, block counter 1."""
    key = bytes(range(32))
    nonce = [0x09000000, 0x4A000000, 0x00000000]
    first = chacha.blocks(chacha.key_words(key), nonce, 1, 1)[0].tolist()
    assert [hex(w) for w in first[:4]] == ["0xe4e7f110", "0x15593bd1", "0x1fdd0f50", "0xc47120a3"]


@pytest.mark.parametrize(("start", "count"), [(0, 5), (3, 17), (13, 1), (8 * 1000 + 5, 100)])
def test_53_bit_words_mid_stream(start: int, count: int) -> None:
    key = bytes(range(1, 33))
    nonce = [3, 1, 4]
    whole = chacha.words53(chacha.key_words(key), nonce, 0, start + count)
    assert torch.equal(chacha.words53(chacha.key_words(key), nonce, start, count), whole[start:])
    raw = (
        Cipher(
            algorithms.ChaCha20(key, (0).to_bytes(4, "little") + b"".join(w.to_bytes(4, "little") for w in nonce)),
            mode=None,
        )
        .encryptor()
        .update(bytes(8 * (start + count)))
    )
    expected = torch.frombuffer(bytearray(raw), dtype=torch.int64)[start:] & ((1 << 53) - 1)
    assert torch.equal(chacha.words53(chacha.key_words(key), nonce, start, count), expected)


@pytest.mark.parametrize(("n", "address"), [(1, (0,)), (7, (5, 2)), (2 * 1000 + 1, (9, 8, 7))])
def test_normals_equal_secure_random_bitwise_on_cpu(n: int, address: tuple[int, ...]) -> None:
    key = bytes(range(100, 132))
    expected = SecureRandom(key, private=True).normal((n,), address, dtype=torch.float64)
    assert torch.equal(chacha.normals(key, address, n, chunk=chacha.CHUNK), expected)


def test_refinement_and_chunking_follow_the_cpu_stream(monkeypatch) -> None:
    """With a threshold that refines many pairs (and small chunks), every refinement word and chunk shift
    lands where the OpenSSL path reads it: the same values, bitwise."""
    import privlm.randomness as randomness

    monkeypatch.setattr(randomness, "_REFINE_BELOW", 2.0**51)  # about one pair in four is refined
    monkeypatch.setattr(randomness, "_CHUNK", 10)
    monkeypatch.setattr(chacha, "_REFINE_BELOW", 2**51)
    monkeypatch.setattr(chacha, "SUPER_CHUNK", 3)
    key = bytes(range(7, 39))
    expected = SecureRandom(key, private=True).normal((95,), (1, 2, 3), dtype=torch.float64)
    assert torch.equal(chacha.normals(key, (1, 2, 3), 95, chunk=10), expected)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        chacha.key_words(b"short")
    with pytest.raises(ValueError, match="address"):
        chacha.normals(bytes(32), (2**32,), 4)


@pytest.mark.slow
def test_compiled_blocks_are_the_eager_blocks() -> None:
    """The fused kernel used on CUDA (compiled here for the CPU: about a minute) gives the same words."""
    kw, nonce = chacha.key_words(bytes(range(32))), [1, 2, 3]
    assert torch.equal(chacha._compiled_blocks()(kw, nonce, 11, 300), chacha.blocks(kw, nonce, 11, 300))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run by benchmarks/gpu_check.sh)")
def test_cuda_keystream_bitwise_and_gaussians_within_ulps() -> None:
    key = bytes(range(50, 82))
    kw, nonce = chacha.key_words(key), [7, 0, 1]
    assert torch.equal(chacha.blocks(kw, nonce, 3, 1000, "cuda").cpu(), chacha.blocks(kw, nonce, 3, 1000))
    secure = SecureRandom(key, private=True)
    on_gpu = secure.normal((300_001,), (4, 2), dtype=torch.float64, device="cuda").cpu()
    on_cpu = secure.normal((300_001,), (4, 2), dtype=torch.float64)
    torch.testing.assert_close(on_gpu, on_cpu, rtol=1e-14, atol=1e-14)  # log/sin/cos may differ in the last ulp
    torch.testing.assert_close(  # cast to float32: equal up to one float32 ulp at a rounding boundary
        secure.normal((300_001,), (4, 2), device="cuda").cpu(), secure.normal((300_001,), (4, 2)), rtol=1.2e-7, atol=0
    )


def test_whole_chunks_computed_together_equal_secure_random_bitwise() -> None:
    """Several whole chunks of the real size (computed as one batch) and a shorter last one."""
    key = bytes(range(3, 35))
    n = 3 * chacha.CHUNK + 1001
    expected = SecureRandom(key, private=True).normal((n,), (6, 1), dtype=torch.float64)
    assert torch.equal(chacha.normals(key, (6, 1), n), expected)


@pytest.mark.parametrize("refine_below", [2**44, 2**47])
def test_runs_of_batched_chunks_around_refined_ones_follow_the_cpu_stream(monkeypatch, refine_below: int) -> None:
    """Rarer refinements (one pair in 512 or 64) with groups of 8 small chunks: runs of batched chunks,
    a refined chunk, then the rest of its group regenerated from the shifted offset."""
    import privlm.randomness as randomness

    monkeypatch.setattr(randomness, "_REFINE_BELOW", float(refine_below))
    monkeypatch.setattr(randomness, "_CHUNK", 12)
    monkeypatch.setattr(chacha, "_REFINE_BELOW", refine_below)
    monkeypatch.setattr(chacha, "SUPER_CHUNK", 8)
    key = bytes(range(11, 43))
    expected = SecureRandom(key, private=True).normal((2 * 1000 + 7,), (2, 2), dtype=torch.float64)
    assert torch.equal(chacha.normals(key, (2, 2), 2 * 1000 + 7, chunk=12), expected)
