"""The hybrid rule: n-gram proposals where the n-gram is confident (a suffix match of >= ``min_match`` tokens), the
draft model otherwise, at a shorter K (its acceptance decays along the window; the n-gram's continuations are either
right for a while or wrong at once).

The rule only decides; the decoding core runs the draft model when told to (its KV cache must also see the tokens
emitted on n-gram steps: ``HybridEngineDrafter`` below, and the BLS orchestrator's draft engine requests).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtspec.speculative.drafters import DrafterKind, Proposal, StatelessLocalDrafter, finish_proposals, in_vocab
from trtspec.speculative.drafters.ngram import JobIndexes, NgramDrafter, PromptIndex

HYBRID_MIN_MATCH = 2
HYBRID_MODEL_K = 3


@dataclass(frozen=True)
class Choice:
    """What to do this step: the n-gram's tokens, or the draft model for ``k`` tokens."""

    kind: DrafterKind  # NGRAM or MODEL
    k: int
    proposal: Proposal | None = None  # the n-gram's proposal when kind is NGRAM


class HybridRule(StatelessLocalDrafter):
    """n-gram on a match of >= ``min_match`` tokens, else the draft model at ``min(k, model_k)``."""

    def __init__(self, ngram: NgramDrafter, min_match: int = HYBRID_MIN_MATCH, model_k: int = HYBRID_MODEL_K) -> None:
        if min_match < 1 or model_k < 1:
            raise ValueError("min_match and model_k must be >= 1")
        self.ngram = ngram
        self.min_match = min_match
        self.model_k = model_k

    def choose(self, context: Sequence[int], k: int, index: PromptIndex | None = None) -> Choice:
        """What to do after ``context`` (``index``: its prompt-lookup index, trtspec.speculative.drafters.ngram)."""
        proposal = self.ngram.propose(context, k, index)
        if proposal.tokens and proposal.match_len >= self.min_match:
            return Choice(DrafterKind.NGRAM, len(proposal.tokens), proposal)
        return Choice(DrafterKind.MODEL, min(k, self.model_k))

    # -- as the BLS orchestrator's drafter (trtspec.speculative.drafters.LocalDrafter) ---------------------------
    def new_state(self, sampling: Any = None) -> PromptIndex | None:
        return self.ngram.new_state(sampling)

    def plan(self, state: Any, seq: Sequence[int], k: int) -> tuple[list[int] | None, int]:
        """(n-gram tokens, 0) on a confident match, else (None, how many tokens to ask the draft engine for)."""
        choice = self.choose(seq, k, state)  # state: new_state's index, or None
        if choice.kind is DrafterKind.NGRAM and choice.proposal is not None:
            return choice.proposal.tokens[:k], 0
        return None, min(choice.k, k)


class HybridEngineDrafter:
    """The in-flight engine's hybrid: n-gram proposals on a confident match, else the draft model (``HybridRule``).
    The draft model's cache must still see the tokens committed on n-gram steps: ``ModelDrafter.commit`` with nothing
    proposed queues them, and its next step feeds them in its first pass (one forward of a few tokens)."""

    kind = DrafterKind.HYBRID

    def __init__(self, rule: HybridRule, model: Any) -> None:
        self.rule = rule
        self.model = model  # a ModelDrafter (trtspec.runtimes.inflight.drafter)
        self.vocab = model.vocab
        self.ngram_steps = 0
        self.model_steps = 0
        self._by_model: set[int] = set()  # ids of the jobs whose proposals this step are the model's
        self.indexes = JobIndexes(rule.ngram.max_match)

    @property
    def passes(self) -> int:
        return int(self.model.passes)

    @property
    def free(self) -> int:
        return int(self.model.free)

    def admit(self, job: Any) -> None:
        self.model.admit(job)
        self.indexes.track(job)

    def release(self, job: Any, keep: bool = True) -> None:
        self._by_model.discard(id(job))
        self.indexes.untrack(job)
        self.model.release(job, keep)

    def propose(self, jobs: list[Any], ks: list[int], batch_tokens: int = 0, batch_seqs: int = 0) -> list[Proposal]:
        t0 = time.perf_counter()
        out: list[Proposal] = [Proposal() for _ in jobs]
        to_model, model_ks = [], []
        for i, (job, k) in enumerate(zip(jobs, ks)):
            choice = self.rule.choose(job.history(), k, self.indexes.of(job))
            tokens = in_vocab(choice.proposal.tokens[:k], self.vocab) if choice.proposal is not None else []
            if choice.kind is DrafterKind.NGRAM and tokens:
                out[i] = Proposal(tokens)
                self.ngram_steps += 1
            else:
                to_model.append(i)
                model_ks.append(max(1, min(k, choice.k)))
        self._by_model |= finish_proposals(self.model, jobs, out, to_model, model_ks, t0)
        self.model_steps += len(to_model)
        return out

    def commit(self, job: Any, history_before: int, proposed: int, accepted: int) -> None:
        by_model = id(job) in self._by_model
        self._by_model.discard(id(job))
        # After an n-gram step the model proposed nothing: its cache is intact, the committed tokens are queued.
        self.model.commit(job, history_before, proposed if by_model else 0, accepted if by_model else 0)

    def observe_pass(self, tokens: int, seconds: float, rows: int = 0, verify_s: float = 0.0, seqs: int = 1) -> None:
        pass
