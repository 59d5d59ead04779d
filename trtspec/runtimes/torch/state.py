"""One model's decoding state over a batch of rows: its KV cache, which cache positions are valid, and forward passes.

Each row's cache holds a prefix of that row's committed tokens (``n_valid`` of them); the tokens after it are fed in
the next forward pass. New tokens of different lengths per row are right-aligned, so the last ``keep`` logits of every
row belong to its last real tokens; the left-over slots are holes that the attention mask hides.
"""

from __future__ import annotations

from typing import Any

import torch

from trtspec.runtimes.torch.cache import GrowableCache


class ModelState:
    """KV cache + validity mask of one model for a batch of rows (see module docstring)."""

    def __init__(self, model: Any, batch_size: int, pad_id: int = 0) -> None:
        self.model = model
        self.pad_id = pad_id
        self.cache = GrowableCache()
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool)  # [B, T] physical positions holding real tokens
        self.n_valid = torch.zeros(batch_size, dtype=torch.long)  # real tokens per row (its logical length)

    @property
    def has_holes(self) -> bool:
        return bool((self.n_valid != self.valid.shape[1]).any())

    def forward(self, rows: list[list[int]], keep: int, hidden: bool = False) -> torch.Tensor:
        """Feed each row its new tokens (any lengths, >= 1 for some row); return logits [B, keep, V] of the last ones
        (``hidden``: the body's last hidden states [B, keep, H] instead, for a head applied on demand)."""
        b = len(rows)
        m = max(len(r) for r in rows)
        t = self.valid.shape[1]
        ids = torch.full((b, m), self.pad_id, dtype=torch.long)
        new_valid = torch.zeros(b, m, dtype=torch.bool)
        for i, r in enumerate(rows):
            if r:
                ids[i, m - len(r) :] = torch.tensor(r, dtype=torch.long)
                new_valid[i, m - len(r) :] = True
        offsets = new_valid.long().cumsum(1) - 1
        positions = (self.n_valid[:, None] + offsets.clamp_min(0)).long()
        mask = None
        if self.has_holes or not bool(new_valid.all()):
            keys = torch.cat([self.valid, new_valid], dim=1)  # [B, T + m]
            causal = torch.ones(m, t + m, dtype=torch.bool).tril(diagonal=t)
            mask = keys[:, None, None, :] & causal[None, None]
            # A hole attends to itself only, so no query row is fully masked (that would give NaN keys downstream).
            diag = torch.arange(m)
            mask[:, 0, diag, t + diag] = True
        if hidden:
            out = self.model.model(
                input_ids=ids, position_ids=positions, attention_mask=mask, cache=self.cache, use_cache=True
            )
            result = out.last_hidden_state[:, -keep:]
        else:
            out = self.model(
                input_ids=ids,
                position_ids=positions,
                attention_mask=mask,
                cache=self.cache,
                use_cache=True,
                logits_to_keep=keep,
            )
            result = out.logits
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.n_valid = self.n_valid + new_valid.sum(1)
        return result

    def truncate(self, lengths: torch.Tensor) -> None:
        """Keep only the first ``lengths[b]`` real tokens of each row; crop the common tail; compact when mostly
        holes."""
        lengths = torch.minimum(lengths.long(), self.n_valid)
        logical = self.valid.long().cumsum(1)
        self.valid &= logical <= lengths[:, None]
        self.n_valid = lengths
        any_valid = self.valid.any(0).nonzero()
        end = int(any_valid[-1]) + 1 if len(any_valid) else 0
        drop = self.valid.shape[1] - end
        if drop:
            self.cache.crop(-drop)
            self.valid = self.valid[:, :end]
        if self.valid.shape[1] > 16 and int(self.n_valid.max()) * 2 < self.valid.shape[1]:
            self._compact()

    def _compact(self) -> None:
        """Move each row's valid positions to the right end of a cache as long as the longest row."""
        b, width = self.valid.shape[0], int(self.n_valid.max())
        index = torch.zeros(b, width, dtype=torch.long)
        valid = torch.zeros(b, width, dtype=torch.bool)
        for i in range(b):
            pos = self.valid[i].nonzero().squeeze(1)
            n = len(pos)
            if n:
                index[i, width - n :] = pos
                valid[i, width - n :] = True
        self.cache.gather_positions(index)
        self.valid = valid

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished rows leave the batch)."""
        self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]
        self.n_valid = self.n_valid[rows]
