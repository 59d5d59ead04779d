"""Drafters: what proposes the draft tokens of a step. One module per drafter (``ngram``, ``hybrid``, ``adaptive``; the
draft model's is ``trtspec.runtimes.inflight.drafter``, which needs its KV cache), and one registry
(``registry``: what each kind needs, which runtimes and orchestrations serve it, how each process builds it).

The target verifies any proposal exactly as it verifies a draft model's (``draft_input_ids``), so every drafter is
lossless: greedy output stays the target's, and a proposal without a distribution is a point mass q = 1 on its token,
which keeps rejection sampling exact (accept with probability p(x)).

Three interfaces, by caller:

- per request and step, from its tokens so far (``Drafter``): ``propose(context, k) -> Proposal``;
- the in-flight engine's (``EngineDrafter``): ``admit(job)``, ``propose(jobs, ks, batch_tokens, batch_seqs)``,
  ``commit(job, history_before, proposed, accepted)``, ``release(job, keep)``, ``free`` (jobs it can still take),
  ``observe_pass(tokens, seconds, rows, verify_s, seqs)`` (the step's target pass over ``seqs`` sequences, and the
  verification of its rows);
- the BLS orchestrator's (``LocalDrafter``): ``new_state(sampling)`` per request,
  ``plan(state, seq, k) -> (tokens or None, model_k)`` before a step, ``plain_run(state)`` after a plan that
  proposed nothing (how many tokens the target then generates in one call, streamed: a plain stretch),
  ``verdict(state, proposed, accepted, target_s, draft_s, plain_tokens)`` after it (with the engine calls'
  seconds; ``plain_tokens``: what a plain stretch produced), ``finish(state)`` when the request ends (its steps no
  longer share the target's passes with the others).

Light to import (no torch): the Triton models and the CLI load it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, Sequence

__all__ = [
    "Drafter",
    "DrafterKind",
    "EngineDrafter",
    "LocalDrafter",
    "Proposal",
    "StatelessLocalDrafter",
    "UNLIMITED",
    "in_vocab",
]


class DrafterKind(str, Enum):
    """What proposes the draft tokens (``speculative.drafter``; each kind's entry: ``registry.DRAFTERS``)."""

    MODEL = "model"
    NGRAM = "ngram"
    HYBRID = "hybrid"
    ADAPTIVE = "adaptive"


UNLIMITED = 1 << 30  # a drafter without per-job memory (n-grams) takes any number of jobs


@dataclass
class Proposal:
    """Draft tokens for one step, how long a suffix of the context matched to find them (0: no match), where they
    came from, and the draft's distribution over them (``q``: [len(tokens), V] when a draft model samples; None: a
    point mass on each token)."""

    tokens: list[int] = field(default_factory=list)
    match_len: int = 0
    source: str = "none"  # "prompt" (lookup in the request's own tokens), "pool", "model", "none"
    q: Any = None


def finish_proposals(
    model: Any, jobs: list[Any], out: list[Proposal], to_model: list[int], model_ks: list[int], t0: float
) -> set[int]:
    """The common end of a step of a drafter that mixes local proposals with a draft model's: charge the local
    proposing time (since ``t0``) to every job, fill ``out`` at ``to_model`` with the model's proposals of
    ``model_ks`` tokens, and return the ids of the jobs the model proposed for."""
    import time

    dt = time.perf_counter() - t0
    for job in jobs:
        job.stats.draft_s += dt
    if not to_model:
        return set()
    for i, p in zip(to_model, model.propose([jobs[i] for i in to_model], model_ks)):
        out[i] = p
    return {id(jobs[i]) for i in to_model}


def in_vocab(tokens: list[int], vocab: int) -> list[int]:
    """The proposal up to its first token the target cannot take (a pool of another vocabulary)."""
    for i, t in enumerate(tokens):
        if not 0 <= t < vocab:
            return tokens[:i]
    return tokens


class Drafter(Protocol):
    """What the decoding core calls once per request and step."""

    def propose(self, context: Sequence[int], k: int) -> Proposal:
        """Up to ``k`` draft tokens continuing ``context`` (prompt + answer so far)."""
        ...


class EngineDrafter(Protocol):
    """What the in-flight engine calls (see the module docstring). ``admit`` must leave ``job.draft_state`` set: the
    engine asks only jobs that have one."""

    vocab: int

    @property
    def free(self) -> int: ...

    def admit(self, job: Any) -> None: ...

    def propose(self, jobs: list[Any], ks: list[int], batch_tokens: int = 0, batch_seqs: int = 0) -> list[Proposal]: ...

    def commit(self, job: Any, history_before: int, proposed: int, accepted: int) -> None: ...

    def release(self, job: Any, keep: bool = True) -> None: ...

    def observe_pass(self, tokens: int, seconds: float, rows: int = 0, verify_s: float = 0.0, seqs: int = 1) -> None:
        """The target's packed pass of this step fed ``tokens`` tokens of ``seqs`` sequences in ``seconds``, and
        verifying its ``rows`` (the head and the acceptance routine) took ``verify_s``; adaptive drafters learn
        both."""


class LocalDrafter(Protocol):
    """What the BLS orchestrator calls per request (see the module docstring)."""

    def new_state(self, sampling: Any = None) -> Any: ...

    def plan(self, state: Any, seq: Sequence[int], k: int) -> tuple[list[int] | None, int]: ...

    def plain_run(self, state: Any) -> int: ...

    def verdict(
        self,
        state: Any,
        proposed: int,
        accepted: int,
        target_s: float = 0.0,
        draft_s: float = 0.0,
        plain_tokens: int = 0,
    ) -> None: ...

    def finish(self, state: Any) -> None: ...


class StatelessLocalDrafter:
    """A ``LocalDrafter`` that learns nothing (n-grams, the hybrid's rule): ``plan`` is its own, and ``new_state``
    where it keeps something per request (the n-grams' prompt-lookup index); a step it proposes nothing for is one
    plain target step, then it looks again."""

    def new_state(self, sampling: Any = None) -> Any:
        return None

    def plain_run(self, state: Any) -> int:
        return 1

    def verdict(
        self,
        state: Any,
        proposed: int,
        accepted: int,
        target_s: float = 0.0,
        draft_s: float = 0.0,
        plain_tokens: int = 0,
    ) -> None:
        pass

    def finish(self, state: Any) -> None:
        pass
