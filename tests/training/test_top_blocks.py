"""``--train-layers N`` over a cached frozen prefix (float64 tiny models, seeded): the cached top blocks give the
uncached model's per-sample losses (generate, lm and the label-word objective; Llama and GPT-2), its per-sample
gradient norms in every norm mode (and the exact ones equal a micro-batch-of-one autograd loop; Hutchinson
equals its formula on those gradients), and its weights step for step (seeded noise and none); the output
layer runs at the loss positions only; each cached row is a function of its own example (bitwise); a cache
built for other rows, another model or another block is refused; a resume that reads the cache ends where
the uninterrupted run ends; a block count beyond the model is refused."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from privlm.dpsgd.clipping import PerSampleClipper
from privlm.dpsgd.engine import PrivateModel
from privlm.dpsgd.losses import causal_lm_losses, label_word_lm_losses
from privlm.dpsgd.sampling import physical_batches
from privlm.errors import UserError
from privlm.lm.completion import HEADLINE_TEMPLATE, encode_completions
from privlm.lm.prompts import pad_token_id
from privlm.norm_modes import NORM_MODES
from privlm.privacy import Ledger
from privlm.randomness import SecureRandom
from privlm.resources.tiny import build_tiny_model
from privlm.resources.verbalizers import Verbalizer
from privlm.training import top_blocks
from privlm.training.data import TaskData, encode, make_collate
from privlm.training.head import label_token_ids
from privlm.training.loop import TrainConfig, prepare, train_loop
from privlm.training.run import set_up, with_lora
from privlm.training.top_blocks import (
    TopBlocks,
    cached_rows,
    collate_prefix,
    decoder_parts,
    length_sorted_batches,
    top_label_word_losses,
    top_token_losses,
    train_top_blocks,
)

WORDS = ["market", "shares", "school", "budget", "team", "match", "goal", "film", "story", "news"]
ROWS = tuple(
    (
        f"article {i}: the " + " ".join(WORDS[(i * 3 + j) % 10] for j in range(3 + i % 11)) + " rose today.",
        " ".join(WORDS[(i + j) % 10] for j in range(1 + i % 3)),
    )
    for i in range(12)
)
MAX_LENGTH = 40
LAYERS = 3  # tiny models with 3 decoder blocks: block 0 (and the embeddings) stay below the cache
VERBALIZER = Verbalizer(" It was ", ("good", "great"))
REVIEWS = tuple(
    (f"review {i}: the film was " + "so " * (i % 5) + ("fine" if i % 2 else "slow"), i % 2) for i in range(10)
)


def _model(name="tiny-llama", blocks=2, lora=0, seed=0, dtype=torch.float64):
    model, tokenizer = build_tiny_model(name, seed=seed, dtype=dtype, layers=LAYERS)
    module = with_lora(model, lora, 0, blocks) if lora else train_top_blocks(model, blocks)
    if lora:  # LoRA's B starts at 0: move it so that the A matrices get a gradient too
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for n, p in module.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module, tokenizer


def _completions(tokenizer, rows=ROWS, max_length=MAX_LENGTH):
    return encode_completions(tokenizer, rows, max_length=max_length, template=HEADLINE_TEMPLATE)


def _cached(tmp_path, module, tokenizer, encoded, blocks=2, label_ids=None, name="cache", dtype="float64"):
    features = top_blocks.load_or_build(
        tmp_path / name, module, blocks, encoded, pad_token_id(tokenizer), MAX_LENGTH, dtype
    )
    return cached_rows(features, encoded, label_ids)


def _label_ids(tokenizer):
    return torch.tensor(label_token_ids(tokenizer, VERBALIZER), dtype=torch.long)


def _classify_rows(tokenizer):
    return encode(TaskData("classify", REVIEWS, (), VERBALIZER), tokenizer, MAX_LENGTH)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
@pytest.mark.parametrize("lora", [0, 4], ids=["full-blocks", "lora"])
def test_cached_top_blocks_give_the_uncached_per_sample_losses(tmp_path, name, lora):
    module, tokenizer = _model(name, lora=lora)
    encoded = _completions(tokenizer)
    top = TopBlocks(module, 2)
    cached = top_token_losses(top, collate_prefix(_cached(tmp_path, module, tokenizer, encoded)))
    uncached = causal_lm_losses(module, make_collate(tokenizer)(encoded), reduction="mean")
    torch.testing.assert_close(cached, uncached, rtol=1e-12, atol=1e-12)
    lm = encode(TaskData("lm", tuple(p for p, _ in ROWS), (), None), tokenizer, MAX_LENGTH)
    lm_cached = top_token_losses(top, collate_prefix(_cached(tmp_path, module, tokenizer, lm, name="lm")))
    lm_uncached = causal_lm_losses(module, make_collate(tokenizer)(lm), reduction="mean")
    torch.testing.assert_close(lm_cached, lm_uncached, rtol=1e-12, atol=1e-12)


def test_cached_label_word_losses_equal_the_uncached_objective(tmp_path):
    module, tokenizer = _model(lora=4)
    rows, ids = _classify_rows(tokenizer), _label_ids(tokenizer)
    cached = _cached(tmp_path, module, tokenizer, rows, label_ids=ids.tolist())
    assert all(r.positions.numel() == 1 for r in cached)  # one loss position: the one predicting the label word
    got = top_label_word_losses(TopBlocks(module, 2), collate_prefix(cached), ids)
    expected = label_word_lm_losses(module, make_collate(tokenizer)(rows), ids)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_the_output_layer_runs_at_the_loss_positions_only(tmp_path):
    module, tokenizer = _model()
    encoded = _completions(tokenizer)
    top = TopBlocks(module, 2)
    seen = []
    handle = top.output.register_forward_hook(lambda mod, args, out: seen.append(tuple(args[0].shape)))
    top_token_losses(top, collate_prefix(_cached(tmp_path, module, tokenizer, encoded)))
    handle.remove()
    targets = max(e.n_completion_tokens for e in encoded)
    assert seen == [(len(encoded), targets, 32)]  # (B, P, d) with P the most target tokens, not T
    assert targets < max(len(e.input_ids) for e in encoded) // 2


def _reference_grads(module, rows, collate, loss):
    """Each example alone (a micro-batch of one, unpadded), plain autograd: no hook, no engine code."""
    params = [p for p in module.parameters() if p.requires_grad]
    return [torch.autograd.grad(loss(module, collate([row]))[0], params) for row in rows]


def _clipper(module, loss_fn, mode, clip=1.0):
    clipper = PerSampleClipper(
        module, loss_fn, max_grad_norm=clip, norm_mode=mode, probes=6, randomness=SecureRandom.from_seed(0, "probes")
    )
    clipper.begin_step(1)
    return clipper


def _hutchinson(grads, clipper):
    """‖g_jᵀ P_j‖²/k summed over the weight matrices j (P_j: the step's probes of parameter j), plus ‖g_j‖² of
    the vectors (norm weights, biases: exact in every mode), for each example."""
    out = []
    for sample in grads:
        total = 0.0
        for param, g in zip(clipper.params, sample):
            if g.dim() == 2:
                probes = clipper.probe_matrix(param, 6, g.dtype, g.device)
                total += float((g.T @ probes).pow(2).sum()) / 6
            else:
                total += float(g.pow(2).sum())
        out.append(total)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("mode", NORM_MODES)
@pytest.mark.parametrize("task", ["generate", "classify"])
@pytest.mark.parametrize("lora", [0, 4], ids=["full-blocks", "lora"])
def test_per_sample_norms_equal_the_uncached_model_and_autograd_in_every_mode(tmp_path, mode, task, lora):
    module, tokenizer = _model(lora=lora)
    if task == "generate":
        rows, ids = _completions(tokenizer), None
        uncached_loss = functools.partial(causal_lm_losses, reduction="mean")
        cached_loss = top_token_losses
    else:
        rows, ids = _classify_rows(tokenizer), _label_ids(tokenizer)
        uncached_loss = functools.partial(label_word_lm_losses, label_ids=ids)
        cached_loss = functools.partial(top_label_word_losses, label_ids=ids)
    collate = make_collate(tokenizer)
    top = TopBlocks(module, 2)
    cached = collate_prefix(_cached(tmp_path, module, tokenizer, rows, label_ids=None if ids is None else ids.tolist()))
    uncached_norms = _clipper(module, uncached_loss, mode).sq_norms(collate(rows))
    clipper = _clipper(top, cached_loss, mode)
    cached_norms = clipper.sq_norms(cached)
    assert bool((uncached_norms > 0).all())
    torch.testing.assert_close(cached_norms, uncached_norms, rtol=1e-10, atol=0)
    # the reference runs each example unpadded, and eager attention takes its softmax in float32 even in a
    # float64 model: another row width rounds the attention weights differently (measured up to 1.6e-8)
    grads = _reference_grads(module, rows, collate, uncached_loss)
    if mode in ("exact", "ghost", "mixed"):
        reference = torch.stack([sum(g.pow(2).sum() for g in sample) for sample in grads])
        torch.testing.assert_close(cached_norms, reference, rtol=1e-6, atol=0)
    elif mode == "hutchinson":
        torch.testing.assert_close(cached_norms, _hutchinson(grads, clipper), rtol=1e-6, atol=0)


MANY = tuple((f"article {i}: the " + "market rose " * (i * 7 % 17), "shares gain") for i in range(30))


@pytest.mark.parametrize("mode", NORM_MODES)
def test_length_sorted_micro_batches_cut_padding_and_give_the_whole_batch_clipped_sum(tmp_path, mode):
    module, tokenizer = _model(lora=4)
    rows = _cached(tmp_path, module, tokenizer, _completions(tokenizer, MANY[:12]))
    batch = collate_prefix(rows)
    micro = list(length_sorted_batches(batch, 5))
    assert [m["attention_mask"].shape[0] for m in micro] == [5, 5, 2]
    lengths = [int(n) for m in micro for n in m["attention_mask"].sum(1)]
    assert lengths == sorted((r.hidden.shape[0] for r in rows), reverse=True)  # every row once, longest first
    for m in micro:  # each cut to its own longest row and most loss positions: no column of padding only
        assert int(m["attention_mask"][:, -1].max()) == 1
        assert int((m["targets"][:, -1] >= 0).max()) == 1
    padded = sum(len(lengths[i : i + 5]) * lengths[i] for i in range(0, 12, 5))  # each chunk at its longest
    assert sum(m["attention_mask"].numel() for m in micro) == padded < batch["attention_mask"].numel()
    top = TopBlocks(module, 2)
    sums = []
    for cut, size in ((physical_batches, None), (length_sorted_batches, 5), (length_sorted_batches, 1)):
        clipper = _clipper(top, top_token_losses, mode, clip=0.05)  # below every norm: every row is clipped
        stats = PrivateModel(top, clipper, size, cut).clipped_backward(batch)
        clipper.capture.remove()
        assert bool((stats.factors < 1).all())
        sums.append({p: g.clone() for p, g in clipper.summed_grads.items()})
    assert len(sums[0]) == len(clipper.params) > 0
    for other in sums[1:]:  # eager attention's float32 softmax rounds another width differently (see above)
        for p, whole in sums[0].items():
            torch.testing.assert_close(other[p], whole, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("private", [True, False], ids=["seeded-noise", "no-noise"])
@pytest.mark.parametrize("lora", [0, 4], ids=["full-blocks", "lora"])
def test_cached_training_equals_uncached_training_step_for_step(tmp_path, private, lora):
    config = TrainConfig(
        task="generate",
        noise_multiplier=1.0 if private else None,
        private=private,
        norm_mode="hutchinson" if private else "mixed",
        train_layers=2,
        lora=lora,
        batch_size=5,
        epochs=3,
        lr=0.05,
        seed=0,
        physical_batch_size=3,
        log_every=1,
    )
    weights = []
    for use_cache in (False, True):
        module, tokenizer = _model(lora=lora)
        encoded = _completions(tokenizer)
        if use_cache:
            run = prepare(
                TopBlocks(module, 2),
                _cached(tmp_path, module, tokenizer, encoded, name=f"cache-{lora}-{private}"),
                collate_prefix,
                config,
                loss_fn=top_token_losses,
                micro_batches=length_sorted_batches,  # as privlm train runs it: sorted, each cut to its longest row
            )
        else:
            run = prepare(module, encoded, make_collate(tokenizer), config)
        seen = []

        def record(*_, seen=seen, module=module):
            seen.append([p.detach().clone() for p in module.parameters() if p.requires_grad])

        result = train_loop(run, on_progress=record)
        assert result.steps == 9
        weights.append(seen)
    start = [p for p in _model(lora=lora)[0].parameters() if p.requires_grad]
    assert not torch.allclose(weights[0][-1][0], start[0])  # training moved the weights
    for uncached, cached in zip(*weights):
        for u, c in zip(uncached, cached):
            torch.testing.assert_close(c, u, rtol=1e-9, atol=1e-11)


ADDED = {"short": ("up", "yes"), "long": ("the market rose " * 12, "shares fall")}


@pytest.mark.parametrize("added", sorted(ADDED))
def test_adding_one_example_leaves_every_other_cached_row_bitwise_unchanged(tmp_path, added):
    """float32 and the bfloat16 cache: the added example shifts the rows after it into other batches and other
    chunks of the resumable build; no other row's cached states may change in a single bit."""
    module, tokenizer = _model(dtype=torch.float32)
    pad = pad_token_id(tokenizer)
    rows = _completions(tokenizer, MANY)
    before = {
        dtype: top_blocks.load_or_build(tmp_path / f"before-{dtype}", module, 2, rows, pad, MAX_LENGTH, dtype, 7)
        for dtype in ("float32", "bfloat16")
    }
    for position in (0, len(MANY) // 2, len(MANY)):
        grown = _completions(tokenizer, MANY[:position] + (ADDED[added],) + MANY[position:])
        for dtype, reference in before.items():
            after = top_blocks.load_or_build(
                tmp_path / f"after-{dtype}-{position}", module, 2, grown, pad, MAX_LENGTH, dtype, 7
            ).rows()
            others = after[:position] + after[position + 1 :]
            assert all(torch.equal(a, b) for a, b in zip(others, reference.rows(), strict=True))


def test_a_cache_built_for_other_rows_another_model_or_another_block_is_refused(tmp_path):
    module, tokenizer = _model()
    encoded = _completions(tokenizer)
    pad = pad_token_id(tokenizer)
    _cached(tmp_path, module, tokenizer, encoded)
    other = _completions(tokenizer, ((ROWS[0][0] + " again", ROWS[0][1]),) + ROWS[1:])
    with pytest.raises(UserError, match="other training rows"):
        top_blocks.load_or_build(tmp_path / "cache", module, 2, other, pad, MAX_LENGTH, "float64")
    with pytest.raises(UserError, match="another model"):
        top_blocks.load_or_build(tmp_path / "cache", _model(seed=1)[0], 2, encoded, pad, MAX_LENGTH, "float64")
    with pytest.raises(UserError, match="layout or dtype"):  # the states entering block 2, not block 1
        top_blocks.load_or_build(tmp_path / "cache", _model(blocks=1)[0], 1, encoded, pad, MAX_LENGTH, "float64")
    with pytest.raises(UserError, match="layout or dtype"):
        top_blocks.load_or_build(tmp_path / "cache", module, 2, encoded, pad, MAX_LENGTH, "bfloat16")
    meta = json.loads((tmp_path / "cache" / "meta.json").read_text())
    assert meta["n_train"] == len(encoded) and meta["n_test"] == 0 and "PRIVATE" in meta["note"]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_runs_that_differ_only_above_the_prefix_share_its_cache(tmp_path, name):
    """Another LoRA rank or initialisation (another seed), or full blocks instead of adapters: the same states
    enter the trained blocks, so the cache is read, not rebuilt; the prefix's own weights still bind it."""
    module, tokenizer = _model(name, lora=4)
    encoded = _completions(tokenizer)
    pad = pad_token_id(tokenizer)
    built = top_blocks.load_or_build(tmp_path / "cache", module, 2, encoded, pad, MAX_LENGTH, "float64")
    assert built.build_s is not None
    model, _ = build_tiny_model(name, seed=0, dtype=torch.float64, layers=LAYERS)
    for other in (
        with_lora(model, 2, 7, 2),
        train_top_blocks(build_tiny_model(name, seed=0, dtype=torch.float64, layers=LAYERS)[0], 2),
    ):
        read = top_blocks.load_or_build(tmp_path / "cache", other, 2, encoded, pad, MAX_LENGTH, "float64")
        assert read.build_s is None and all(torch.equal(a, b) for a, b in zip(read.rows("train"), built.rows("train")))
    changed, _ = build_tiny_model(name, seed=0, dtype=torch.float64, layers=LAYERS)
    with torch.no_grad():  # one weight of block 0, below the trained blocks
        next(decoder_parts(changed).blocks[0].parameters()).add_(1e-3)
    with pytest.raises(UserError, match="another model"):
        top_blocks.load_or_build(
            tmp_path / "cache", train_top_blocks(changed, 2), 2, encoded, pad, MAX_LENGTH, "float64"
        )


def test_a_block_count_beyond_the_model_is_refused():
    model, _ = build_tiny_model("tiny-llama", seed=0, layers=LAYERS)
    for bad in (0, LAYERS + 1):
        with pytest.raises(UserError, match=f"--train-layers must be in 1..{LAYERS}"):
            TopBlocks(model, bad)
    with pytest.raises(UserError, match="--train-layers must be in 1..2"):
        set_up("tiny-llama", "bbc-headlines", TrainConfig(task="generate", noise_multiplier=1.0, train_layers=3))
    with pytest.raises(UserError, match="drop --lora-layers"):
        TrainConfig(noise_multiplier=1.0, train_layers=2, lora=4, lora_layers=1)
    with pytest.raises(UserError, match="--head-only"):
        TrainConfig(noise_multiplier=1.0, train_layers=2, head_only=True)


def _session(data: str, cache_dir, lora: int, physical: int | None = None):
    config = TrainConfig(
        physical_batch_size=physical,
        task="generate",
        noise_multiplier=1.0,
        norm_mode="ghost",
        train_layers=1,
        lora=lora,
        cache="float32",
        batch_size=4,
        epochs=2,
        lr=0.05,
        seed=0,
        max_length=MAX_LENGTH,
        checkpoint_every=2,
        log_every=1,
    )
    return set_up("tiny-llama", data, config, cache_dir=cache_dir)


@pytest.mark.parametrize(
    ("lora", "physical"), [(0, None), (4, None), (4, 1)], ids=["full-blocks", "lora", "lora-other-micro-batches"]
)
def test_resume_with_a_cache_equals_the_uninterrupted_run(tmp_path, killed_after_step, lora, physical):
    """``physical``: the resume runs micro-batches of that many rows (memory only, so a resume may change it):
    the same run up to rounding."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in ROWS * 2))
    full = _session(f"jsonl:{data}", tmp_path / "cache", lora)
    assert isinstance(full.run.module, TopBlocks) and full.features.train_counts is not None
    reference = train_loop(full.run, tmp_path / "full")
    assert reference.steps >= 8

    with killed_after_step(5):
        train_loop(_session(f"jsonl:{data}", tmp_path / "cache", lora).run, tmp_path / "resumed")
    resumed = _session(f"jsonl:{data}", tmp_path / "cache", lora, physical)  # reads the cache, checked as well
    assert resumed.features.build_s is None
    result = train_loop(resumed.run, tmp_path / "resumed", resume=True)
    assert result.resumed_from == 4 and result.steps == reference.steps
    for (name, p), q in zip(resumed.module.named_parameters(), full.module.parameters()):
        if physical is None:
            assert torch.equal(p, q), name
        else:  # float32: other micro-batch widths round the attention differently
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)
    ledger, uninterrupted = (Ledger.load(tmp_path / name / "privacy.json") for name in ("resumed", "full"))
    assert (ledger.entries, ledger.private_release) == (uninterrupted.entries, uninterrupted.private_release)
