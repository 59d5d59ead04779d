"""A KV cache for speculative decoding: preallocated, cropped in O(1), with per-row validity for batches.

transformers' DynamicLayer concatenates on every update (a full copy of the cache per forward pass). GrowableLayer
writes new keys and values into a buffer that doubles when full, and crop only moves the length back: rolling back
rejected draft tokens costs nothing and the prefix is never recomputed.

For batch > 1, sequences accept different numbers of tokens per step. Rejected positions stay in the buffer as holes
that the attention mask hides (``SequenceBatch.valid``); position ids count valid tokens only, so a row computes
exactly what it would alone. The common tail of holes is cropped each step, and the cache is compacted when holes
exceed half of it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class GrowableLayer(DynamicLayer):
    """One layer's keys/values in a capacity-doubling buffer; ``keys``/``values`` are views of the valid length."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._len = 0

    def _ensure(self, extra: int, like: torch.Tensor) -> None:
        need = self._len + extra
        if self._k is not None and self._k.shape[-2] >= need:
            return
        cap = max(64, need, 2 * (self._k.shape[-2] if self._k is not None else 0))
        b, h, _, d = like.shape
        k = like.new_empty((b, h, cap, d))
        v = like.new_empty((b, h, cap, d))
        if self._k is not None and self._v is not None and self._len:
            k[..., : self._len, :] = self._k[..., : self._len, :]
            v[..., : self._len, :] = self._v[..., : self._len, :]
        self._k, self._v = k, v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        m = key_states.shape[-2]
        self._ensure(m, key_states)
        assert self._k is not None and self._v is not None
        self._k[..., self._len : self._len + m, :] = key_states
        self._v[..., self._len : self._len + m, :] = value_states
        self._len += m
        self.keys = self._k[..., : self._len, :]
        self.values = self._v[..., : self._len, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._len if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count (tokens to remove from the end)")
        if not self.is_initialized or tokens_to_remove == 0:
            return
        self._len = max(0, self._len + tokens_to_remove)
        assert self._k is not None and self._v is not None  # initialized: update() allocated them
        self.keys = self._k[..., : self._len, :]
        self.values = self._v[..., : self._len, :]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if not self.is_initialized or self._k is None or self._v is None:
            return
        self._k, self._v = self._k[indices], self._v[indices]
        self.keys = self._k[..., : self._len, :]
        self.values = self._v[..., : self._len, :]

    def gather_positions(self, index: torch.Tensor) -> None:
        """Keep, per row, the positions in ``index`` [B, T'] (compaction of holes)."""
        if not self.is_initialized or self._k is None or self._v is None:
            return
        b, h, _, d = self._k.shape
        idx = index[:, None, :, None].expand(b, h, index.shape[1], d)
        self._k = torch.gather(self._k[..., : self._len, :], 2, idx).contiguous()
        self._v = torch.gather(self._v[..., : self._len, :], 2, idx).contiguous()
        self._len = index.shape[1]
        self.keys, self.values = self._k, self._v


class GrowableCache(DynamicCache):
    """A DynamicCache whose layers are GrowableLayer."""

    def __init__(self) -> None:  # noqa: D107 - skip DynamicCache's config-driven layer setup
        Cache.__init__(self, layer_class_to_replicate=GrowableLayer)

    def gather_positions(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            layer.gather_positions(index)  # type: ignore[union-attr]  # every layer is a GrowableLayer
