"""One forward pass over a packed batch: every sequence's new tokens concatenated, attention per sequence on its slot.

The model runs with batch dimension 1 over all new tokens (no padding: a 1-token decode step and a 300-token prefill
share one pass). A registered attention function writes each sequence's new keys/values into its KV slot and attends
over that slot's prefix, causally. Rotary embeddings come from explicit position ids. Any transformers causal LM whose
attention goes through ``ALL_ATTENTION_FUNCTIONS`` works (Llama, Mistral, Qwen2, ... with full attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from trtspec.runtimes.inflight.kv_pool import SlotKVPool
from trtspec.runtimes.inflight.llama_step import LlamaStep

ATTENTION_NAME = "trtspec_slot_kv"
_BATCH_KWARG = "trtspec_packed_batch"


@dataclass(frozen=True)
class Segment:
    """One sequence in a packed pass: its slot, how many tokens the slot already holds, where its new tokens are."""

    slot: int
    past: int
    start: int
    count: int


@dataclass(frozen=True)
class PackedBatch:
    pool: SlotKVPool
    segments: Sequence[Segment]


_MASKS: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _causal_mask(count: int, past: int, device: torch.device) -> torch.Tensor:
    """[count, past + count] bool on ``device``: new token i sees the prefix and new tokens 0..i."""
    key = (count, past, device)
    m = _MASKS.get(key)
    if m is None:
        m = torch.ones(count, past + count, dtype=torch.bool, device=device).tril(diagonal=past)
        if len(_MASKS) < 4096:
            _MASKS[key] = m
    return m


def slot_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key/value [1, Hkv, T, D] of the packed tokens -> output [1, T, H, D].

    Called without a packed batch (the same model used by plain transformers code, e.g. ``generate``), it is
    transformers' own SDPA attention."""
    batch: PackedBatch | None = kwargs.pop(_BATCH_KWARG, None)
    if batch is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    layer = module.layer_idx
    keys, values = batch.pool.keys[layer], batch.pool.values[layer]
    gqa = query.shape[1] != key.shape[1]
    if len(batch.segments) == 1:
        seg = batch.segments[0]
        out = _attend(keys, values, query, key, value, seg, scaling, gqa)
    else:
        out = torch.empty_like(query)
        for seg in batch.segments:
            out[:, :, seg.start : seg.start + seg.count] = _attend(keys, values, query, key, value, seg, scaling, gqa)
    return out.transpose(1, 2), None


def _attend(
    keys: torch.Tensor,
    values: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    seg: Segment,
    scaling: float | None,
    gqa: bool,
) -> torch.Tensor:
    a, n, p, s = seg.start, seg.count, seg.past, seg.slot
    keys[s, :, p : p + n] = key[0, :, a : a + n]
    values[s, :, p : p + n] = value[0, :, a : a + n]
    k = keys[s : s + 1, :, : p + n]
    v = values[s : s + 1, :, : p + n]
    q = query[:, :, a : a + n]
    mask = None if n == 1 else _causal_mask(n, p, query.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa)


_REGISTERED = False


def prepare_model(model: Any) -> Any:
    """Switch an HF causal LM to slot attention (idempotent); the model must be owned by the engine."""
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface

        AttentionInterface.register(ATTENTION_NAME, slot_attention)
        _REGISTERED = True
    model.config._attn_implementation = ATTENTION_NAME
    for sub in model.modules():  # composite configs (text_config) carry their own copy
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = ATTENTION_NAME
    return model


_DUMMY_MASKS: dict[torch.device, torch.Tensor] = {}


def _dummy_mask(device: torch.device) -> torch.Tensor:
    """A 4D mask (transformers then skips building one; slot attention ignores it) on the model's device."""
    m = _DUMMY_MASKS.get(device)
    if m is None:
        m = _DUMMY_MASKS[device] = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)
    return m


@torch.inference_mode()
def packed_forward(
    model: Any,
    pool: SlotKVPool,
    feeds: Sequence[tuple[int, int, Sequence[int]]],
    keep: Sequence[int],
    *,
    hidden: bool = False,
    fast: LlamaStep | None = None,
) -> torch.Tensor:
    """Run ``feeds`` = [(slot, past, new_tokens)] as one pass; return logits [len(keep), V] at packed indices ``keep``
    (with ``hidden``: the body's last hidden states [len(keep), H] there, for a head applied on demand). ``fast``:
    the model's fused step (trtspec.runtimes.inflight.llama_step) instead of the transformers module tree.

    Writes the new tokens' keys/values into the slots at positions past.. past+len-1 (callers update slot tokens).
    """
    segments = []
    ids: list[int] = []
    pos: list[int] = []
    for slot, past, tokens in feeds:
        segments.append(Segment(slot, past, len(ids), len(tokens)))
        ids.extend(tokens)
        pos.extend(range(past, past + len(tokens)))
    device = pool.keys[0].device
    if fast is not None:
        rows = torch.tensor(list(keep), dtype=torch.long, device=device)
        ids_t, pos_t = torch.tensor(ids, device=device), torch.tensor(pos, device=device)
        states = fast.body(pool, [(s.slot, s.past, s.start, s.count) for s in segments], ids_t, pos_t)[rows]
        return states if hidden else model.lm_head(states)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    position_ids = torch.tensor([pos], dtype=torch.long, device=device)
    batch = {_BATCH_KWARG: PackedBatch(pool, segments)}
    if hidden:
        states = model.model(
            input_ids=input_ids, position_ids=position_ids, attention_mask=_dummy_mask(device), use_cache=False, **batch
        ).last_hidden_state
        return states[0, torch.tensor(list(keep), dtype=torch.long, device=device)]
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=_dummy_mask(device),
        use_cache=False,
        logits_to_keep=torch.tensor(list(keep), dtype=torch.long, device=device),
        **batch,
    )
    return out.logits[0]
