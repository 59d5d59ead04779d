"""The hybrid rule: n-gram proposals where the n-gram is confident (a suffix match of >= ``min_match`` tokens), the
draft model otherwise, at a shorter K (its acceptance decays along the window; the n-gram's continuations are either
right for a while or wrong at once).

The rule only decides; the decoding core runs the draft model when told to (its KV cache must also see the tokens
emitted on n-gram steps: ``ModelState`` feeds them on the next model step, one forward of a few tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtspec.engines.drafters import DrafterKind, Proposal
from trtspec.engines.drafters.ngram import NgramDrafter

HYBRID_MIN_MATCH = 2
HYBRID_MODEL_K = 3


@dataclass(frozen=True)
class Choice:
    """What to do this step: the n-gram's tokens, or the draft model for ``k`` tokens."""

    kind: DrafterKind  # NGRAM or MODEL
    k: int
    proposal: Proposal | None = None  # the n-gram's proposal when kind is NGRAM


class HybridRule:
    """n-gram on a match of >= ``min_match`` tokens, else the draft model at ``min(k, model_k)``."""

    def __init__(self, ngram: NgramDrafter, min_match: int = HYBRID_MIN_MATCH, model_k: int = HYBRID_MODEL_K) -> None:
        if min_match < 1 or model_k < 1:
            raise ValueError("min_match and model_k must be >= 1")
        self.ngram = ngram
        self.min_match = min_match
        self.model_k = model_k

    def choose(self, context: Sequence[int], k: int) -> Choice:
        proposal = self.ngram.propose(context, k)
        if proposal.tokens and proposal.match_len >= self.min_match:
            return Choice(DrafterKind.NGRAM, len(proposal.tokens), proposal)
        return Choice(DrafterKind.MODEL, min(k, self.model_k))
