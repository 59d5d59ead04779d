"""A distilled draft's frequent-token head: a torch-runtime optimization applied at load time, never an architecture.

`trtspec distill` writes the draft as a standard checkpoint of its target's family (LlamaForCausalLM for the
example: full vocabulary, ``vocab_size`` equal to the target's), so every runtime, ModelOpt and the quality stage
load it as it is. Its ``lm_head`` holds trained rows for the N tokens the target writes most often and zero rows for
the rest, and ``config.json`` records that as ``"trtspec_frequent_head": {"tokens": N}``.

A plain loader computes the full head: a zero row scores 0, below the best frequent-token logit at every held-out
position measured (the report counts the exceptions), so the greedy proposals are the frequent head's. trtspec's
loader (:func:`apply_frequent_head`) computes only the N rows and returns -inf elsewhere: on a CPU the draft's
vocabulary head dominates its cost (FACTS: 8,192 of 49,152 rows is a 6x smaller matmul). The target still verifies
over its whole vocabulary, so the output is unchanged either way.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from trtspec.runtimes.inflight import cpu_kernels

CONFIG_KEY = "trtspec_frequent_head"
log = logging.getLogger("trtspec.frequent_head")


class FrequentHead(nn.Module):
    """``lm_head`` over the vocabulary, evaluated only on ``token_ids``; -inf logits for every other token.

    ``weight`` is the checkpoint's full [V, H] parameter (state dict and ``save_pretrained`` unchanged, and
    ``get_output_embeddings().weight`` still spans the vocabulary); ``rows`` is a copy of the N rows it scores."""

    token_ids: torch.Tensor  # buffers (register_buffer)
    rows: torch.Tensor

    def __init__(self, linear: nn.Linear, token_ids: torch.Tensor) -> None:
        super().__init__()
        self.weight = linear.weight
        ids = torch.sort(token_ids.long().to(linear.weight.device)).values
        self.register_buffer("token_ids", ids, persistent=False)
        self.register_buffer("rows", linear.weight.detach()[ids].clone(), persistent=False)

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of the N frequent tokens only ([..., N], in ``token_ids`` order)."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        if flat.shape[0] <= cpu_kernels.MAX_ROWS and hidden.dtype == self.rows.dtype and cpu_kernels.applies(self.rows):
            return cpu_kernels.linear(flat, self.rows).view(*hidden.shape[:-1], -1)  # a draft step's few rows
        return hidden @ self.rows.T.to(hidden.dtype)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = self.scores(hidden)
        out = sub.new_full((*sub.shape[:-1], self.out_features), float("-inf"))
        out[..., self.token_ids] = sub
        return out

    def argmax(self, hidden: torch.Tensor) -> list[int]:
        """Each row's argmax of :meth:`forward` without the full-vocabulary logits: the frequent tokens' argmax,
        mapped to its token id. ``token_ids`` ascend, so a tie resolves to the lowest id, as over the full logits
        (measured on the example's draft, one row: 0.6 + 0.2 ms for the full logits and their argmax)."""
        return self.token_ids[self.scores(hidden).reshape(-1, len(self.token_ids)).argmax(-1)].tolist()


def frequent_rows(weight: torch.Tensor) -> torch.Tensor:
    """Token ids whose head rows are not all zero (the frequent head of a distilled draft)."""
    return (weight.detach() != 0).any(dim=1).nonzero().flatten()


def apply_frequent_head(model: Any) -> bool:
    """Swap in :class:`FrequentHead` when the config records one and the weights agree; True when applied.

    A checkpoint whose non-zero rows no longer match the record (a fine-tuned full head) keeps its full head."""
    meta = getattr(model.config, CONFIG_KEY, None)
    head = getattr(model, "lm_head", None)
    if not isinstance(meta, dict) or not isinstance(head, nn.Linear) or head.bias is not None:
        return False
    if head.weight.shape[0] != model.config.vocab_size:
        return False
    ids = frequent_rows(head.weight)
    if len(ids) != int(meta.get("tokens", -1)):
        log.warning(
            "%s records %s frequent tokens but lm_head has %d non-zero rows: using the full head",
            CONFIG_KEY,
            meta.get("tokens"),
            len(ids),
        )
        return False
    model.lm_head = FrequentHead(head, ids)
    return True
