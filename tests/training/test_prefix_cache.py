"""The feature cache of a head-only run: each cached row is a function of its own example only (adding one
example leaves every other row's features bitwise unchanged, float32 and bfloat16); training on cached
features equals training through the frozen model, loss for loss, norm for norm and step for step
(float64, tiny Llama, with and without seeded noise; to rounding, since the uncached run computes h in
its own batch shapes); a cache built for other rows, another model or another layout is refused; a
resume that reads the cache ends where the uninterrupted run ends."""

from __future__ import annotations

import json

import pytest
import torch

from privlm.dpsgd.clipping import PerSampleClipper
from privlm.errors import UserError
from privlm.lm.prompts import pad_token_id
from privlm.privacy import Ledger
from privlm.randomness import SecureRandom
from privlm.resources.tiny import build_tiny_model
from privlm.resources.verbalizers import Verbalizer
from privlm.training import prefix_cache
from privlm.training.data import TaskData, encode, make_collate
from privlm.training.head import LabelWordHead, head_losses, label_token_ids
from privlm.training.loop import TrainConfig, prepare, train_loop
from privlm.training.prefix_cache import cached_rows, collate_cached, compute_features, load_or_build
from privlm.training.run import set_up

VERBALIZER = Verbalizer(" It was ", ("good", "great"))  # one tiny-tokenizer token each
TRAIN = tuple(
    (f"review {i}: the film was " + "so " * (i % 5) + ("fine" if i % 2 else "slow"), i % 2) for i in range(16)
)
TEST = TRAIN[:4]


def _head(seed: int = 0, dtype: torch.dtype = torch.float64):
    model, tokenizer = build_tiny_model("tiny-llama", seed=seed, dtype=dtype)
    return LabelWordHead(model, label_token_ids(tokenizer, VERBALIZER)), tokenizer


MAX_LENGTH = 40


def _rows(tokenizer, train=TRAIN, max_length=MAX_LENGTH):
    data = TaskData("classify", train, TEST, VERBALIZER)
    return encode(data, tokenizer, max_length), encode(data, tokenizer, max_length, split="test")


def _cached(tmp_path, head, tokenizer):
    train, test = _rows(tokenizer)
    features = load_or_build(
        tmp_path / "cache", head, train, test, pad_token_id(tokenizer), MAX_LENGTH, dtype="float64"
    )
    return cached_rows(features.train, [y for _, y in TRAIN])


MANY = tuple(("the film was " + "so " * (i * 7 % 33) + ("fine" if i % 2 else "slow"), i % 2) for i in range(48))
WIDE = 48  # the public width cap: MANY's rows have 8-41 tokens, 13, 22 and 13 of them in the widths 16, 32 and 48
ADDED = {  # the added example: 5 tokens (width 16), 20 (width 32), or 48 (cut from the left, width 48)
    "short": ("so", 1),
    "medium": ("the film was so " * 4, 0),
    "long": ("the film was so fine " * 8, 1),
}


def _others(features, position):
    """Every row of ``features`` but the added one at ``position``."""
    return torch.cat([features[:position], features[position + 1 :]])


@pytest.mark.parametrize("added", sorted(ADDED))
def test_adding_one_example_leaves_every_other_row_bitwise_unchanged(tmp_path, added):
    """Inserted first, in the middle or last, the added example shifts the rows after it into other batches
    (and other 16-row chunks of the resumable build): no other row's float32 features, nor its cached
    bfloat16 ones, may change in a single bit. Batching the rows sorted by length into batches of 8 (the
    pass this replaces) fails here with the short example (41 other rows change batch shape, one row's
    features move by 1.8e-7); with the medium one 25 rows change shape but happen to round alike on this
    model (not on SmolLM2: the slow test below)."""
    head, tokenizer = _head(dtype=torch.float32)
    pad = pad_token_id(tokenizer)
    rows, test = _rows(tokenizer, MANY, WIDE)
    before = compute_features(head, rows, pad, WIDE)
    cached_before = load_or_build(tmp_path / "before", head, rows, test, pad, WIDE, chunk=16).train
    assert cached_before.dtype == torch.bfloat16
    for position in (0, len(MANY) // 2, len(MANY)):
        grown, _ = _rows(tokenizer, MANY[:position] + (ADDED[added],) + MANY[position:], WIDE)
        assert torch.equal(_others(compute_features(head, grown, pad, WIDE), position), before)
        cached = load_or_build(tmp_path / f"after-{position}", head, grown, test, pad, WIDE, chunk=16).train
        assert torch.equal(_others(cached, position), cached_before)


@pytest.mark.slow
def test_on_smollm2_adding_one_example_leaves_every_other_row_bitwise_unchanged():
    """The same on the real SmolLM2, where length-sorted batching moved other rows of these examples (with
    the short one added: 3 of 48 in float32, by up to 1.1e-5, and one by 7.8e-3 in 2 coordinates after
    the bfloat16 cast; with the medium one: 2 rows, the same bfloat16 move)."""
    from privlm.resources.models import load_model

    model, tokenizer = load_model("smollm2-135m")
    head = LabelWordHead(model, label_token_ids(tokenizer, VERBALIZER))
    pad = pad_token_id(tokenizer)
    rows, _ = _rows(tokenizer, MANY, WIDE)
    before = compute_features(head, rows, pad, WIDE)
    for added, position in (("short", 0), ("medium", len(MANY) // 2)):
        grown, _ = _rows(tokenizer, MANY[:position] + (ADDED[added],) + MANY[position:], WIDE)
        after = _others(compute_features(head, grown, pad, WIDE), position)
        assert torch.equal(after, before) and torch.equal(after.bfloat16(), before.bfloat16())


@pytest.mark.parametrize("mode", ["mixed", "hutchinson"])
def test_cached_batches_give_the_uncached_losses_and_norms(tmp_path, mode):
    """The uncached losses compute h in one token batch of all rows, the cache in its fixed shapes: the
    same h up to float64 rounding of another batch shape (here even bitwise), which the 1e-12 tolerances
    leave room for."""
    head, tokenizer = _head()
    train, _ = _rows(tokenizer)
    tokens = make_collate(tokenizer)(train)
    cached = collate_cached(_cached(tmp_path, head, tokenizer))
    torch.testing.assert_close(head_losses(head, cached), head_losses(head, tokens), rtol=1e-12, atol=1e-12)
    norms = []
    for batch in (tokens, cached):
        clipper = PerSampleClipper(
            head,
            head_losses,
            max_grad_norm=1.0,
            norm_mode=mode,
            probes=4,
            randomness=SecureRandom.from_seed(0, "probes"),
        )
        clipper.begin_step(1)
        norms.append(clipper.sq_norms(batch))
    assert bool((norms[0] > 0).all())
    torch.testing.assert_close(norms[1], norms[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("private", [True, False], ids=["seeded-noise", "no-noise"])
def test_cached_training_equals_uncached_training_step_for_step(tmp_path, private):
    config = TrainConfig(
        noise_multiplier=1.0 if private else None,
        private=private,
        head_only=True,
        batch_size=6,
        epochs=3,
        lr=0.05,
        seed=0,
        physical_batch_size=4,
        log_every=1,
    )
    weights = []
    for use_cache in (False, True):
        head, tokenizer = _head()
        train, _ = _rows(tokenizer)
        rows, collate = (
            (_cached(tmp_path, head, tokenizer), collate_cached) if use_cache else (train, make_collate(tokenizer))
        )
        run = prepare(head, rows, collate, config, loss_fn=head_losses)
        seen = []
        result = train_loop(
            run, on_progress=lambda *_, seen=seen, head=head: seen.append(head.rows.weight.detach().clone())
        )
        weights.append(seen)
        assert result.steps == 9
    start = _head()[0].rows.weight
    assert not torch.allclose(weights[0][-1], start)  # training moved the rows
    for uncached, cached in zip(*weights):
        torch.testing.assert_close(cached, uncached, rtol=1e-10, atol=1e-12)


def test_a_cache_built_for_other_rows_or_another_model_is_refused(tmp_path):
    head, tokenizer = _head()
    _cached(tmp_path, head, tokenizer)
    train, test = _rows(tokenizer)
    other = ((TRAIN[0][0] + " again", 0),) + TRAIN[1:]
    other_train, _ = _rows(tokenizer, other)
    with pytest.raises(UserError, match="other training rows"):
        load_or_build(tmp_path / "cache", head, other_train, test, pad_token_id(tokenizer), MAX_LENGTH, dtype="float64")
    with pytest.raises(UserError, match="another model"):
        load_or_build(
            tmp_path / "cache", _head(seed=1)[0], train, test, pad_token_id(tokenizer), MAX_LENGTH, dtype="float64"
        )
    with pytest.raises(UserError, match="layout or dtype"):
        load_or_build(tmp_path / "cache", head, train, test, pad_token_id(tokenizer), MAX_LENGTH, dtype="bfloat16")
    with pytest.raises(UserError, match="layout or dtype"):  # another public width cap: other batch shapes
        load_or_build(tmp_path / "cache", head, train, test, pad_token_id(tokenizer), MAX_LENGTH + 8, dtype="float64")
    meta = json.loads((tmp_path / "cache" / "meta.json").read_text())
    assert meta["n_train"] == len(TRAIN) and "PRIVATE" in meta["note"]


class Crash(RuntimeError):
    """The simulated kill."""


def test_a_killed_build_resumes_at_its_last_chunk_and_equals_an_uninterrupted_build(tmp_path, monkeypatch):
    head, tokenizer = _head()
    train, test = _rows(tokenizer)
    shape = (pad_token_id(tokenizer), MAX_LENGTH)
    whole = load_or_build(tmp_path / "whole", head, train, test, *shape, dtype="float64", chunk=5)
    calls, crashed = [], []
    compute = prefix_cache.compute_features

    def compute_then_crash(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3 and not crashed:
            crashed.append(1)
            raise Crash("killed in the third chunk")
        return compute(*args, **kwargs)

    monkeypatch.setattr(prefix_cache, "compute_features", compute_then_crash)
    with pytest.raises(Crash):
        load_or_build(tmp_path / "cache", head, train, test, *shape, dtype="float64", chunk=5)
    assert not (tmp_path / "cache").exists() and len(list((tmp_path / ".cache.partial").glob("train-*"))) == 2
    with pytest.raises(UserError, match="partial feature cache .* other training rows"):
        load_or_build(
            tmp_path / "cache", head, _rows(tokenizer, TRAIN[::-1])[0], test, *shape, dtype="float64", chunk=5
        )
    calls.clear()
    resumed = load_or_build(tmp_path / "cache", head, train, test, *shape, dtype="float64", chunk=5)
    assert len(calls) == 3  # train chunks 3 and 4 (16 rows, 5 per chunk) and the test chunk: nothing recomputed
    assert torch.equal(resumed.train, whole.train) and torch.equal(resumed.test, whole.test)
    assert not (tmp_path / ".cache.partial").exists()


def test_a_build_computes_its_chunks_in_length_order_and_refuses_a_partial_cut_the_old_way(tmp_path, monkeypatch):
    """Chunks hold rows of similar length (few filler rows); the values come back in row order, equal to
    one whole-set pass; a partial build whose chunks were cut in row order (an older privlm) is refused."""
    head, tokenizer = _head()
    train, test = _rows(tokenizer)
    shape = (pad_token_id(tokenizer), MAX_LENGTH)
    seen: list[list[int]] = []
    compute = prefix_cache.compute_features

    def record(head_, rows, *args, **kwargs):
        seen.append([len(r.input_ids) for r in rows])
        return compute(head_, rows, *args, **kwargs)

    monkeypatch.setattr(prefix_cache, "compute_features", record)
    built = load_or_build(tmp_path / "cache", head, train, test, *shape, dtype="float64", chunk=5)
    train_chunks = seen[: -(-len(train) // 5)]
    flat = [n for chunk in train_chunks for n in chunk]
    assert flat == sorted(len(r.input_ids) for r in train) and len(set(flat)) > 1
    direct = compute(head, train, *shape).to(torch.float64)
    assert torch.equal(built.train, direct)  # row order, whatever the chunks
    partial = tmp_path / ".old.partial"
    partial.mkdir()
    key = json.loads((tmp_path / "cache" / "meta.json").read_text())["key"]
    (partial / "key.json").write_text(json.dumps(key))  # no chunk order: written by an older privlm
    with pytest.raises(UserError, match="older privlm"):
        load_or_build(tmp_path / "old", head, train, test, *shape, dtype="float64", chunk=5)


def _session(data: str, cache_dir):
    config = TrainConfig(
        noise_multiplier=1.0,
        head_only=True,
        batch_size=4,
        epochs=2,
        lr=0.05,
        seed=0,
        max_length=40,
        checkpoint_every=2,
        log_every=1,
    )
    return set_up("tiny-llama", data, config, labels="neg=good,pos=great", cache_dir=cache_dir)


def test_resume_with_a_cache_equals_the_uninterrupted_run(tmp_path, killed_after_step):
    data = tmp_path / "reviews.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": ["neg", "pos"][y]}) + "\n" for t, y in TRAIN * 2))
    full = _session(f"jsonl:{data}", tmp_path / "cache")
    reference = train_loop(full.run, tmp_path / "full")
    assert reference.steps >= 8

    with killed_after_step(5):
        train_loop(_session(f"jsonl:{data}", tmp_path / "cache").run, tmp_path / "resumed")
    resumed = _session(f"jsonl:{data}", tmp_path / "cache")  # reads the cache, checked against the rows and model
    result = train_loop(resumed.run, tmp_path / "resumed", resume=True)
    assert result.resumed_from == 4 and result.steps == reference.steps
    assert torch.equal(resumed.module.rows.weight, full.module.rows.weight)
    ledger, uninterrupted = (Ledger.load(tmp_path / name / "privacy.json") for name in ("resumed", "full"))
    assert (ledger.entries, ledger.private_release) == (uninterrupted.entries, uninterrupted.private_release)
