"""Draft proposals for the in-flight engine: a draft model with its own slot KV cache, shared packed passes.

Each step, every speculative job asks for K_i tokens. Round r feeds, in one packed pass, each job still drafting its
pending tokens (round 0: whatever of its sequence the draft's cache lacks; later rounds: its last proposal) and
samples (or takes the argmax of) its next proposal, with the same sampling transform the target applies, keeping the
distribution q for rejection sampling. After the target's verdict the draft's cache is cut back to what it computed
of the committed sequence (never recomputed), exactly as the target's is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtspec.runtimes.inflight.jobs import Job
from trtspec.runtimes.inflight.kv_pool import KVGeometry, Slot, SlotKVPool, device_of, synchronize
from trtspec.runtimes.inflight.llama_step import step_of
from trtspec.runtimes.inflight.packed import packed_forward, prepare_model
from trtspec.speculative.drafters import Proposal
from trtspec.speculative.sampling import logits_to_probs, sample
from trtspec.speculative.words import banned_tokens


def draft_pass(
    model: Any, pool: SlotKVPool, feeds: list[tuple[int, int, list[int]]], keep: list[int], fast: Any, plain: bool
) -> tuple[torch.Tensor, list[int] | None]:
    """One draft round's packed pass: (its output, each kept row's argmax where ``plain``, else None). Greedy rows
    without bad words (``plain``) need only the argmax, which a frequent head gives without full-vocabulary logits
    (trtspec.runtimes.torch.frequent_head.FrequentHead.argmax: the same tokens; the output is then the hidden
    states); otherwise the output is logits. A head offers that as its ``argmax`` method (this layer does not import
    the torch runtime's loader)."""
    argmax = getattr(model.lm_head, "argmax", None) if plain else None
    out = packed_forward(model, pool, feeds, keep, hidden=argmax is not None, fast=fast)
    if argmax is not None:
        return out, argmax(out)
    return out, out.argmax(-1).tolist() if plain else None


@dataclass
class _DraftState:
    slot: Slot
    pending: list[int]  # tokens of the committed sequence the draft's cache lacks


class ModelDrafter:
    """Proposals from a draft model (see module docstring). Engine thread only."""

    def __init__(self, model: Any, *, slots: int, capacity: int, fast_step: bool = True) -> None:
        self.model = prepare_model(model)
        self.fast = step_of(self.model) if fast_step else None  # trtspec.runtimes.inflight.llama_step
        self.pool = SlotKVPool(KVGeometry.of(self.model), slots, capacity, device=device_of(self.model))
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self.passes = 0
        # Called after every packed pass with (rows, seconds): the adaptive drafter learns the draft's costs from it.
        self.on_round: Callable[[int, float], None] | None = None

    @property
    def free(self) -> int:
        return self.pool.free

    def admit(self, job: Job) -> None:
        """Take a slot for the job's sequence so far (its prompt, or more when a drafter admits it later)."""
        history = job.history()
        slot, reuse = self.pool.acquire(history)
        job.draft_state = _DraftState(slot, history[reuse:])

    def lag(self, job: Job) -> int:
        """Tokens of the job's sequence the draft's cache lacks before it can draft (all of them before admission)."""
        state = job.draft_state
        return len(state.pending) if isinstance(state, _DraftState) else job.length

    def release(self, job: Job, keep: bool = True) -> None:
        state: _DraftState | None = job.draft_state
        if state is None:
            return
        if not keep:
            self.pool.truncate(state.slot, 0)
        self.pool.release(state.slot)
        job.draft_state = None

    @torch.inference_mode()
    def propose(self, jobs: list[Job], ks: list[int], batch_tokens: int = 0, batch_seqs: int = 0) -> list[Proposal]:
        """K_i proposals for each job (K_i > 0)."""
        t0 = time.perf_counter()
        props = [Proposal(source="model") for _ in jobs]
        qs: list[list[torch.Tensor]] = [[] for _ in jobs]
        histories = [job.history() for job in jobs]
        for r in range(max(ks)):
            rows = [i for i, k in enumerate(ks) if k > r]
            feeds, keep, offset = [], [], 0
            for i in rows:
                state: _DraftState = jobs[i].draft_state
                fed = state.pending if r == 0 else [props[i].tokens[-1]]
                feeds.append((state.slot.index, state.slot.length, fed))
                offset += len(fed)
                keep.append(offset - 1)
            t_round = time.perf_counter()
            plain = all(jobs[i].sampling.greedy and not jobs[i].bad_words for i in rows)
            out, tops = draft_pass(self.model, self.pool, feeds, keep, self.fast, plain)
            self.passes += 1
            if self.on_round is not None and offset <= 2 * len(rows):  # a catch-up (a long round 0) is no round
                synchronize(out.device)
                self.on_round(len(rows), time.perf_counter() - t_round)
            for row, i in enumerate(rows):
                job, state = jobs[i], jobs[i].draft_state
                state.slot.tokens.extend(feeds[row][2])
                if tops is not None:
                    props[i].tokens.append(int(tops[row]))
                    continue
                lg = out[row]
                banned = banned_tokens(histories[i] + props[i].tokens, job.bad_words) if job.bad_words else []
                if banned:
                    lg = lg.clone()
                    lg[banned] = float("-inf")
                if job.sampling.greedy:
                    tok = int(lg.argmax())
                else:
                    q = logits_to_probs(lg, job.sampling)
                    qs[i].append(q)
                    tok = sample(q, job.generator)  # type: ignore[arg-type]
                props[i].tokens.append(tok)
            if r == 0:
                for i in rows:
                    jobs[i].draft_state.pending = []
        for i, p in enumerate(props):
            if qs[i]:
                p.q = torch.stack(qs[i])
        dt = time.perf_counter() - t0
        for job in jobs:
            job.stats.draft_s += dt
        return props

    def commit(self, job: Job, history_before: int, proposed: int, accepted: int) -> None:
        """After the target's verdict: keep the draft's keys for the committed tokens it computed, queue the rest."""
        state: _DraftState | None = job.draft_state
        if state is None:
            return
        if proposed:
            # The cache holds the sequence before the step and the first proposed - 1 proposals.
            self.pool.truncate(state.slot, history_before + min(accepted, proposed - 1))
        state.pending = job.history()[state.slot.length :]

    def observe_pass(self, tokens: int, seconds: float, rows: int = 0, verify_s: float = 0.0, seqs: int = 1) -> None:
        pass


def engine_drafter(
    kind: Any,
    *,
    draft_model: Any = None,
    pool: Any = None,
    vocab: int,
    slots: int,
    capacity: int,
    policy: Any = None,
    fast_step: bool = True,
) -> Any:
    """The in-flight engine's drafter of ``kind`` (``speculative.drafter``, built by its registry entry), with a
    ``ModelDrafter`` of ``slots`` x ``capacity`` over ``draft_model`` where the kind runs the draft model. ``pool``:
    an ``NgramPool``, its file, or None (prompt lookup only); ``vocab``: the target's; ``policy``: the adaptive
    drafter's (trtspec.speculative.adaptive.AdaptivePolicy); ``fast_step``: see ``ModelDrafter``."""
    from trtspec.speculative.drafters.ngram import NgramPool
    from trtspec.speculative.drafters.registry import DrafterContext
    from trtspec.speculative.drafters.registry import engine_drafter as build

    if isinstance(pool, (str, Path)):
        pool = NgramPool.load(Path(pool))
    factory = None
    if draft_model is not None:

        def factory() -> ModelDrafter:
            return ModelDrafter(draft_model, slots=slots, capacity=capacity, fast_step=fast_step)

    return build(kind, DrafterContext(pool=pool, vocab=vocab, model_drafter=factory, policy=policy))
