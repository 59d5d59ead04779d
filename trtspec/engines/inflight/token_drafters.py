"""The n-gram and hybrid drafters (trtspec.engines.drafters) as drafters of the in-flight engine.

The engine calls every drafter the way it calls ``ModelDrafter``: ``admit(job)`` when a speculative job starts (it
must leave ``job.draft_state`` set: the engine asks only jobs that have one), ``propose(jobs, ks)`` once per step for
every speculative job (up to K_i tokens each, possibly none), ``commit(job, history_before, proposed, accepted)``
after the target's verdict, ``release(job, keep)`` when the job ends, and ``free`` (slots left) before admitting.

An n-gram proposal has no distribution: it goes to ``decide`` with ``q=None``, a point mass, so greedy decoding
accepts it while it equals the target's argmax and sampling accepts token x with probability p(x) (exact). Output is
therefore the target's, whatever the n-grams propose.

The hybrid asks the n-gram drafter first; on a confident match (>= ``min_match`` tokens) its tokens are the step's,
otherwise the draft model proposes ``min(K, model_k)`` tokens in the shared packed passes. The draft model's cache
must still see the tokens committed on n-gram steps: ``ModelDrafter.commit`` with nothing proposed queues them, and
its next step feeds them in its first pass (one forward of a few tokens).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trtspec.engines.drafters import DrafterKind
from trtspec.engines.drafters.hybrid import HYBRID_MIN_MATCH, HYBRID_MODEL_K, HybridRule
from trtspec.engines.drafters.ngram import NgramDrafter, NgramPool
from trtspec.engines.inflight.drafter import ModelDrafter, Proposal
from trtspec.engines.inflight.jobs import Job

UNLIMITED = 1 << 30  # an n-gram drafter holds no per-job memory worth a slot


def _in_vocab(tokens: list[int], vocab: int) -> list[int]:
    """The proposal up to its first token the target cannot take (a pool of another vocabulary)."""
    for i, t in enumerate(tokens):
        if not 0 <= t < vocab:
            return tokens[:i]
    return tokens


class NgramEngineDrafter:
    """Prompt lookup + the pool (``NgramDrafter``), per job and step; no KV cache."""

    kind = DrafterKind.NGRAM

    def __init__(self, ngram: NgramDrafter, vocab: int) -> None:
        self.ngram = ngram
        self.vocab = vocab
        self.passes = 0
        self.proposals = 0  # proposals with at least one token

    @property
    def free(self) -> int:
        return UNLIMITED

    def admit(self, job: Job) -> None:
        job.draft_state = self.kind

    def release(self, job: Job, keep: bool = True) -> None:
        job.draft_state = None

    def propose(self, jobs: list[Job], ks: list[int]) -> list[Proposal]:
        t0 = time.perf_counter()
        out = [self._propose(job, k) for job, k in zip(jobs, ks)]
        dt = time.perf_counter() - t0
        for job in jobs:
            job.stats.draft_s += dt
        return out

    def _propose(self, job: Job, k: int) -> Proposal:
        tokens = _in_vocab(self.ngram.propose(job.history(), k).tokens[:k], self.vocab)
        self.proposals += bool(tokens)
        return Proposal(tokens)

    def commit(self, job: Job, history_before: int, proposed: int, accepted: int) -> None:
        pass


class HybridEngineDrafter:
    """n-gram proposals on a confident match, else the draft model (``HybridRule``); see the module docstring."""

    kind = DrafterKind.HYBRID

    def __init__(self, rule: HybridRule, model: ModelDrafter) -> None:
        self.rule = rule
        self.model = model
        self.vocab = model.vocab
        self.ngram_steps = 0
        self.model_steps = 0
        self._by_model: set[int] = set()  # ids of the jobs whose proposals this step are the model's

    @property
    def passes(self) -> int:
        return self.model.passes

    @property
    def free(self) -> int:
        return self.model.free

    def admit(self, job: Job) -> None:
        self.model.admit(job)

    def release(self, job: Job, keep: bool = True) -> None:
        self._by_model.discard(id(job))
        self.model.release(job, keep)

    def propose(self, jobs: list[Job], ks: list[int]) -> list[Proposal]:
        t0 = time.perf_counter()
        out: list[Proposal | None] = [None] * len(jobs)
        to_model, model_ks = [], []
        for i, (job, k) in enumerate(zip(jobs, ks)):
            choice = self.rule.choose(job.history(), k)
            tokens = _in_vocab(choice.proposal.tokens[:k], self.vocab) if choice.proposal is not None else []
            if choice.kind is DrafterKind.NGRAM and tokens:
                out[i] = Proposal(tokens)
                self.ngram_steps += 1
            else:
                to_model.append(i)
                model_ks.append(max(1, min(k, choice.k)))
        dt = time.perf_counter() - t0
        for job in jobs:
            job.stats.draft_s += dt
        if to_model:
            for i, p in zip(to_model, self.model.propose([jobs[i] for i in to_model], model_ks)):
                out[i] = p
                self._by_model.add(id(jobs[i]))
            self.model_steps += len(to_model)
        return out  # type: ignore[return-value]

    def commit(self, job: Job, history_before: int, proposed: int, accepted: int) -> None:
        by_model = id(job) in self._by_model
        self._by_model.discard(id(job))
        # After an n-gram step the model proposed nothing: its cache is intact, the committed tokens are queued.
        self.model.commit(job, history_before, proposed if by_model else 0, accepted if by_model else 0)


def make_drafter(
    kind: DrafterKind | str,
    *,
    draft_model: Any = None,
    pool: NgramPool | Path | str | None = None,
    vocab: int,
    slots: int,
    capacity: int,
    min_match: int = HYBRID_MIN_MATCH,
    model_k: int = HYBRID_MODEL_K,
) -> Any:
    """The engine drafter ``speculative.drafter`` names: the draft model, the n-gram drafter over ``pool`` (None:
    prompt lookup only), or the hybrid of both. ``vocab`` is the target's."""
    kind = DrafterKind(kind)
    if isinstance(pool, (str, Path)):
        pool = NgramPool.load(Path(pool))
    if kind is DrafterKind.NGRAM:
        return NgramEngineDrafter(NgramDrafter(pool), vocab)
    if draft_model is None:
        raise ValueError(f"drafter {kind.value} needs a draft model")
    model = ModelDrafter(draft_model, slots=slots, capacity=capacity)
    if kind is DrafterKind.MODEL:
        return model
    return HybridEngineDrafter(HybridRule(NgramDrafter(pool), min_match=min_match, model_k=model_k), model)
