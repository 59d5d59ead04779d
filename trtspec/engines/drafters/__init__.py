"""Drafters beyond a model: n-gram proposals (prompt lookup + a pool of the target's own answers) and the hybrid rule.

A drafter proposes draft tokens for one request from its tokens so far; the target verifies them exactly as it
verifies a draft model's (``draft_input_ids``), so any proposal is lossless: greedy output stays the target's, and a
proposal that is a point mass q = 1 on its token keeps rejection sampling exact (accept with probability p(x)).

The interface the decoding core calls, per request and per step::

    proposal = drafter.propose(context_tokens, k)   # -> Proposal(tokens: list[int], match_len: int)

Light to import (numpy only): the Triton models and the CLI load it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from trtspec.spec import DrafterKind

__all__ = ["Drafter", "DrafterKind", "Proposal"]


@dataclass(frozen=True)
class Proposal:
    """Draft tokens for one step and how long a suffix of the context matched to find them (0: no match)."""

    tokens: list[int] = field(default_factory=list)
    match_len: int = 0
    source: str = "none"  # "prompt" (lookup in the request's own tokens), "pool", "model", "none"


class Drafter(Protocol):
    """What the decoding core calls once per request and step."""

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        """Up to ``k`` draft tokens continuing ``context`` (prompt + answer so far)."""
        ...
