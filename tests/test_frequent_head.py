"""The draft's frequent head: each row's argmax without the full-vocabulary logits is the full logits' argmax."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trtspec.runtimes.torch.frequent_head import FrequentHead


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_argmax_is_the_full_logits_argmax(dtype: torch.dtype, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    vocab, hidden = 300, 32
    linear = nn.Linear(hidden, vocab, bias=False).to(dtype)
    ids = torch.randperm(vocab, generator=gen)[:40]
    with torch.no_grad():
        weight = torch.zeros(vocab, hidden)
        weight[ids] = torch.randn(40, hidden, generator=gen)
        weight[ids.max()] = weight[ids.min()]  # two rows tie on every input: the lower id wins, as over all logits
        linear.weight.copy_(weight.to(dtype))
    head = FrequentHead(linear, ids)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    with torch.inference_mode():
        full = head(x)
        assert head.argmax(x) == full.argmax(-1).tolist()
        assert set(head.argmax(x)) <= set(ids.tolist())
        boosted = x.clone()  # row 0 along the tied pair's row: they are its maximum
        boosted[0] = linear.weight[ids.min()].to(dtype) * 50
        assert head.argmax(boosted)[0] == int(ids.min()) == int(head(boosted)[0].argmax())
