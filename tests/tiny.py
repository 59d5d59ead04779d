"""Tiny random models and tokenizers for fast tests (built in seconds, deterministic)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding lets a small draft model propose tokens "
    "that a large target model verifies in one pass. def add(a, b):\n    return a + b\n"
    "Q: What is the capital of France? A: Paris. Zürich, naïve café, 東京, emoji 🙂 and more text. "
) * 20


def make_tokenizer(out: Path, vocab_size: int = 512) -> Path:
    """A byte-level BPE tokenizer trained on a fixed corpus (same input -> same vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CORPUS], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(out)
    return out


def make_llama(
    out: Path,
    tokenizer_dir: Path,
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 256,
    seed: int = 0,
    max_positions: int = 4096,
) -> Path:
    """A random LlamaForCausalLM with the tokenizer in ``tokenizer_dir`` (its vocabulary size)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        rope_theta=100000.0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger logits than the default init, so greedy choices are not near-ties
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def perturb_tokenizer(src: Path, out: Path, token_id: int, new_token: str) -> Path:
    """Copy a tokenizer directory with one token's text replaced (same size, different mapping)."""
    import shutil

    shutil.copytree(src, out, dirs_exist_ok=True)
    data = json.loads((out / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    old = next(k for k, v in vocab.items() if v == token_id)
    del vocab[old]
    vocab[new_token] = token_id
    (out / "tokenizer.json").write_text(json.dumps(data))
    return out


def pool_with_two_cached(step: Any, model: Any, prompt: Any, other: Any, capacity: int) -> Any:
    """A 3-slot KV pool for ``model`` with ``prompt`` cached in slot 0 and ``other`` in slot 2 by ``step``'s passes
    (the start of the row-invariance tests: a sequence's next tokens are then fed in different passes)."""
    import torch

    from trtspec.runtimes.inflight.kv_pool import KVGeometry, SlotKVPool

    pool = SlotKVPool(KVGeometry.of(model), 3, capacity)
    step.body(pool, [(0, 0, 0, len(prompt))], prompt, torch.arange(len(prompt)))
    step.body(pool, [(2, 0, 0, len(other))], other, torch.arange(len(other)))
    return pool


def one_per_pass(step: Any, pool: Any, tail: Any, past: int) -> Any:
    """Slot 0's hidden states for ``tail`` fed one token per pass after ``past`` cached ones (decoding)."""
    import torch

    rows = [step.body(pool, [(0, past + i, 0, 1)], tail[i : i + 1], torch.tensor([past + i])) for i in range(len(tail))]
    return torch.cat(rows)
