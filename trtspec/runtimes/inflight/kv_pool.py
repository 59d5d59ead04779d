"""Slot KV cache: one preallocated key/value buffer per layer, one slot per sequence, prefix reuse across requests.

Every sequence (active or finished) owns a slot holding the keys and values of a token prefix. A new request takes the
free slot that shares the longest prefix with its tokens (TRT-LLM's KV block reuse, at slot granularity), so the step
costs only the tokens after that prefix; rolling back rejected draft tokens is a length change. Finished slots stay
cached until a request needs the space: least recently used first. Memory is bounded by ``slots x capacity`` and is
touched only where written.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trtspec.errors import GenerationError
from trtspec.speculative.rules import MAX_DRAFT_LEN

TAIL_SLACK = MAX_DRAFT_LEN  # cached tokens a request may discard from a slot it takes (rejected drafts: at most K)
COPY_MIN_TOKENS = 8  # shorter shared prefixes are recomputed rather than copied


def device_of(model: Any) -> torch.device:
    """Where a model's input ids go (its input embeddings' device): where its KV cache and step inputs live."""
    return model.get_input_embeddings().weight.device


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously: a pass timed without this times its launch)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class KVGeometry:
    """What a model needs per cached token."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, model: Any) -> KVGeometry:
        cfg = model.config
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        dtype = next(model.parameters()).dtype
        return cls(int(cfg.num_hidden_layers), kv_heads, head_dim, dtype)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8


@dataclass
class Slot:
    index: int
    tokens: list[int] = field(default_factory=list)  # the tokens whose keys/values the slot holds, in order
    busy: bool = False
    last_used: int = 0

    @property
    def length(self) -> int:
        return len(self.tokens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in chunks: prompts are often hundreds of tokens.
    while i < n:
        j = min(n, i + 64)
        if list(a[i:j]) == list(b[i:j]):
            i = j
            continue
        while i < j and a[i] == b[i]:
            i += 1
        return i
    return n


class SlotKVPool:
    """``keys[l]`` / ``values[l]``: [slots, kv_heads, capacity, head_dim] per layer (see module docstring)."""

    def __init__(self, geometry: KVGeometry, slots: int, capacity: int, device: Any = None) -> None:
        if slots < 1 or capacity < 2:
            raise GenerationError(
                f"KV cache needs >= 1 slot and capacity >= 2 (got {slots} x {capacity})",
                hint="raise the model's kv_cache_slots / max_seq_len",
            )
        self.geometry = geometry
        self.capacity = capacity
        shape = (slots, geometry.kv_heads, capacity, geometry.head_dim)
        # torch.empty does not touch the pages: resident memory grows with what is written.
        self.keys = [torch.empty(shape, dtype=geometry.dtype, device=device) for _ in range(geometry.num_layers)]
        self.values = [torch.empty(shape, dtype=geometry.dtype, device=device) for _ in range(geometry.num_layers)]
        self.slots = [Slot(i) for i in range(slots)]
        # Per slot: positions below this hold numbers (written once); above, maybe never-touched memory of any bits.
        # A batched attention reads a slot past its sequence under a mask, and a masked NaN still poisons the sum
        # (0 x NaN): ``zero_beyond`` clears such memory once before it is read.
        self.initialized = [0] * slots
        self._clock = itertools.count(1)
        self.reused_tokens = 0  # prefix tokens served from the cache (not recomputed), over the pool's life
        self.computed_tokens = 0  # tokens whose keys/values were computed
        self.copied_tokens = 0  # prefix tokens copied between slots instead of recomputed

    def zero_beyond(self, slot: int, live: int, upto: int) -> None:
        """Make positions < ``upto`` of ``slot`` hold numbers in every layer: zeros from ``live`` (the end of what
        its sequence holds or is writing now) or from where earlier zeroing stopped, whichever is later."""
        start = max(self.initialized[slot], live)
        if upto <= start:
            self.initialized[slot] = max(self.initialized[slot], live)
            return
        for keys, values in zip(self.keys, self.values):
            keys[slot, :, start:upto].zero_()
            values[slot, :, start:upto].zero_()
        self.initialized[slot] = upto

    def check_segments(self, segments: Sequence[tuple[int, int, int, int]], tokens: int) -> None:
        """Raise GenerationError unless every (slot, past, start, count) of a pass over ``tokens`` packed tokens lies
        in this pool and in the pass: trtspec's CPU kernels write the caches at those places unchecked."""
        for slot, past, start, count in segments:
            if not (0 <= slot < len(self.slots) and past >= 0 and past + count <= self.capacity):
                raise GenerationError(
                    f"a pass writes {count} tokens after {past} into slot {slot} of a KV pool of {len(self.slots)} "
                    f"slots x {self.capacity} positions",
                    hint="a sequence outgrew its slot: raise the model's max_seq_len, or stop it earlier",
                )
            if not (0 <= start and start + count <= tokens):
                raise GenerationError(
                    f"a segment's tokens {start}..{start + count - 1} lie outside its pass of {tokens} tokens",
                    hint="this is a bug in the caller of the packed pass",
                )

    @property
    def free(self) -> int:
        return sum(not s.busy for s in self.slots)

    def acquire(self, tokens: Sequence[int]) -> tuple[Slot, int]:
        """A free slot for a sequence of ``tokens`` and how many leading tokens it already holds (< len(tokens)).

        The free slot sharing the longest prefix is taken when that loses at most a few cached tokens (the rejected
        draft tokens of the same sequence's previous step). When taking it would throw away much of another
        sequence's cached context, the least recently used free slot is taken instead and the shared prefix is
        copied into it: a memory copy is far cheaper than recomputing it, and the other sequence keeps its cache.
        """
        free = [s for s in self.slots if not s.busy]
        if not free:
            raise GenerationError("no free KV-cache slot", hint="raise kv_cache_slots or lower max_batch_size")
        best, best_len = free[0], -1
        for s in free:
            n = common_prefix(s.tokens, tokens) if s.tokens else 0
            if n > best_len or (n == best_len and s.last_used < best.last_used):
                best, best_len = s, n
        # At least one token is always fed, so the request gets fresh logits for its last position.
        reuse = min(best_len, len(tokens) - 1)
        chosen = best
        if best.length - reuse > TAIL_SLACK:
            others = [s for s in free if s is not best]
            if others:
                chosen = min(others, key=lambda s: s.last_used)
                if reuse >= COPY_MIN_TOKENS:
                    self._copy_prefix(best, chosen, reuse)
                else:
                    reuse = 0
        chosen.busy = True
        chosen.tokens = list(tokens[:reuse])
        chosen.last_used = next(self._clock)
        self.reused_tokens += reuse
        return chosen, reuse

    def _copy_prefix(self, src: Slot, dst: Slot, n: int) -> None:
        for keys, values in zip(self.keys, self.values):
            keys[dst.index, :, :n] = keys[src.index, :, :n]
            values[dst.index, :, :n] = values[src.index, :, :n]
        self.copied_tokens += n

    def release(self, slot: Slot) -> None:
        """The sequence is done; its prefix stays cached for later requests."""
        slot.busy = False
        slot.last_used = next(self._clock)

    def truncate(self, slot: Slot, length: int) -> None:
        """Keep the first ``length`` tokens (drops rejected draft tokens)."""
        del slot.tokens[length:]

    def check_room(self, slot: Slot, extra: int) -> None:
        if slot.length + extra > self.capacity:
            raise GenerationError(
                f"sequence of {slot.length + extra} tokens exceeds the KV cache capacity ({self.capacity})",
                hint="lower max_tokens or raise max_seq_len in the spec",
            )
