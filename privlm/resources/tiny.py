"""Tiny, randomly initialised causal LMs built in code, for tests and smoke runs (no download).

``tiny-llama`` (Llama: RMSNorm, SwiGLU MLP, rotary attention, tied embeddings) and ``tiny-gpt2``
(GPT-2: LayerNorm, ``Conv1D`` layers, learned positions, tied embeddings) share a small byte-level
BPE tokenizer trained deterministically on a fixed public English passage, so any text can be
tokenized and the same text always gives the same ids.
"""

from __future__ import annotations

import functools

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

TINY_VOCAB_SIZE = 512
EOS_TOKEN = "<|endoftext|>"

# A fixed, public training text for the tiny tokenizer (written for privlm; no private data).
PUBLIC_TEXT = """
It was great. It was bad. It was good. It was terrible. The movie was a delight from start to finish.
The film is slow, dull and far too long. A warm, funny and moving story with a wonderful cast.
The plot makes no sense and the acting is wooden. I loved every minute of it and would watch it again.
This is one of the worst films of the year. The director has made a smart, sharp and honest picture.
Business news: the market rose today as shares in technology companies gained. The government announced
a new budget for schools and hospitals. The team won the match after a late goal in the second half.
Politics, sport, technology, entertainment and business are the five topics of the news articles.
Does the tweet express joy or sadness? What a happy day! I am so sad and tired of everything.
Private text must be protected with differential privacy before a language model can learn from it.
the of and to in is that it was for on with as his they be at one have this from or had by but what
some we can out other were all there when up use your how said an each she which do their time if
will way about many then them write would like so these her long make thing see him two has look more
day could go come did number sound no most people my over know water than call first who may down side
been now find any new work part take get place made live where after back little only round man year
came show every good me give our under name very through just form sentence great think say help low
line differ turn cause much mean before move right boy old too same tell does set three want air well
also play small end put home read hand port large spell add even land here must big high such follow
act why ask men change went light kind off need house picture try us again animal point mother world
"""


@functools.lru_cache(maxsize=1)
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A deterministic byte-level BPE tokenizer with ``TINY_VOCAB_SIZE`` entries (eos = pad = bos)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([PUBLIC_TEXT], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=None,
    )


def tiny_llama_config(hidden_size: int = 32, layers: int = 2, heads: int = 4) -> LlamaConfig:
    """Config of the tiny Llama: tied embeddings, RMSNorm, SwiGLU, 128 positions."""
    tok = tiny_tokenizer()
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def tiny_gpt2_config(hidden_size: int = 32, layers: int = 2, heads: int = 4) -> GPT2Config:
    """Config of the tiny GPT-2: tied embeddings, LayerNorm, ``Conv1D`` layers, 128 positions."""
    tok = tiny_tokenizer()
    return GPT2Config(
        vocab_size=len(tok),
        n_embd=hidden_size,
        n_layer=layers,
        n_head=heads,
        n_positions=128,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )


def build_tiny_model(
    name: str = "tiny-llama", seed: int = 0, dtype: torch.dtype = torch.float32, **config_kwargs: int
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Build ``tiny-llama`` or ``tiny-gpt2`` with weights drawn from ``torch.Generator(seed)``.

    Returns ``(model, tokenizer)``; the model is in eval mode (no dropout) and in ``dtype``.
    """
    builders = {
        "tiny-llama": (tiny_llama_config, LlamaForCausalLM),
        "tiny-gpt2": (tiny_gpt2_config, GPT2LMHeadModel),
    }
    if name not in builders:
        raise KeyError(name)
    make_config, model_cls = builders[name]
    config = make_config(**config_kwargs)
    config._attn_implementation = "eager"
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = model_cls(config)
    finally:
        torch.random.set_rng_state(state)
    model = model.to(dtype).eval()
    return model, tiny_tokenizer()
