"""The adaptive drafter: per sequence and step, the n-grams, the draft model or no speculation, and K, as
``trtspec.speculative.adaptive.AdaptivePolicy`` chooses from the acceptance and costs it measures.

Each step it looks up the n-gram proposal of every sequence (free: a few array lookups), asks the policy what each
sequence does, runs the draft model (when there is one) for the sequences that chose it in the shared packed passes,
and after the target's verdict tells the policy what was accepted. A sequence takes a draft-model slot only when the
model first drafts for it (no draft prefill for sequences the n-grams serve); from then on the draft's KV cache
catches up on the tokens of steps it did not draft, as in the hybrid (``ModelDrafter.commit`` with nothing proposed
queues them).

At a batch where speculation does not pay (concurrency high enough that the policy chooses no speculation for any
sequence), proposing and choosing are themselves the loss: measured at 8 workload conversations in bfloat16, a step
with the adaptive drafter took 36.7 ms against 34.8 without it, the n-gram lookups and the choice for 8 sequences.
So after a plan that speculated for nobody the engine drafter skips both for the next steps, doubling the skip after
each further such plan up to ``quiet_skip_max`` steps, and plans again at once when the batch shrinks (a batch of
fewer sequences may pay) or a plan speculates. A skipped step is a plain target step, as the plan would have made it;
the choice still depends only on committed tokens and earlier steps, so exactness is unchanged. A reproducible
(seeded sampled) sequence in the batch turns the skipping off: its choices must not depend on the batch.

At a batch the policy's gain is a few per cent at best, and its estimates (pass costs calibrated on an idle engine,
acceptance pooled over the server's traffic) err by as much. So the engine drafter also weighs what speculating
realized (``trtspec.speculative.gate``, as the BLS drafter does), per batch size: each
decode step of several sequences, its tokens committed over its seconds from proposing to the verdict, speculative
steps against plain ones; where the speculative steps' rate is below the plain steps', a plan is made only once
in the gate's ``probe_every`` and the other steps are plain. A sequence alone is never gated (its plan prices its
own step, as it is), nor a batch with a reproducible sequence. Measured in process at 8 workload conversations it
is neutral within noise (the gate closed at 7 sequences in the batches' shrinking tails, where speculative steps
had realized 234 against 300 tok/s); it is a guard, not a gain.

Two forms: ``AdaptiveEngineDrafter`` for the in-flight engine (in process and the in-process Triton model) and
``AdaptiveLocalDrafter`` for the BLS orchestrator, which asks the draft engine for the model's tokens and learns the
costs from its own engine calls.

In the BLS orchestrator a step is an engine call, and a plain step one call per token: measured at concurrency 8
on the example pair, never speculating cost 0.68x the target's own streamed decoding (each call waits for a step
boundary, goes through Triton and is admitted anew). So a plan that speculates for nobody steps aside for a stretch:
the target generates ``plain_run`` tokens in one streamed call, 2 after the first such plan in a row, doubling up to
``plain_run_max``, and the policy learns what a plain token cost in it (the step's seconds over its tokens). With
other requests in flight a stretch is ``batch_run`` tokens at once: there every call costs the request about a step
of the batch (it waits for a step boundary; the ramp's calls, 5 per 48-token answer, read 0.91x target-only at
concurrency 8 with no draft at all, some 0.9 of a token's step per call), so a stretch of 64 keeps the calls under 2 %
of the time, and a request comes back to speculating after at most that many tokens. Where speculating has not
paid at the batch's size as realized (``trtspec.speculative.gate``: a request's tokens per second on its speculative
steps against its plain ones), the plan does not speculate and its stretch is ``gated_run`` tokens, most answers in
one call as target-only decoding makes them; one plan in the gate's ``probe_every`` still goes to the policy. A
reproducible (seeded sampled) sequence is never gated and always ramps as if alone: its stretches depend only on its
own plans, so it stays reproducible.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from trtspec.speculative.adaptive import AdaptivePolicy
from trtspec.speculative.arms import MODEL, NGRAM, SequenceArms
from trtspec.speculative.choice import NO_SPECULATION, Ask, OtherSequences
from trtspec.speculative.drafters import UNLIMITED, DrafterKind, Proposal, finish_proposals
from trtspec.speculative.drafters.ngram import NgramDrafter, NgramEngineDrafter, PromptIndex
from trtspec.speculative.gate import RealizedGate


def _reproducible(sampling: Any) -> bool:
    """A seeded sampled request: the same seed must give the same text (its choices depend on its history only)."""
    return sampling is not None and not sampling.greedy and sampling.seed is not None


class AdaptiveEngineDrafter:
    """The in-flight engine's adaptive drafter (trtspec.speculative.drafters.EngineDrafter)."""

    kind = DrafterKind.ADAPTIVE

    def __init__(
        self,
        ngram: NgramDrafter,
        vocab: int,
        model: Any = None,
        policy: AdaptivePolicy | None = None,
        quiet_skip_max: int = 16,
    ) -> None:
        self.ngram = NgramEngineDrafter(ngram, vocab)
        self.model = model  # a ModelDrafter (trtspec.runtimes.inflight.drafter), or None: n-grams or nothing
        self.vocab = vocab
        self.policy = policy or AdaptivePolicy()
        if model is not None:
            model.on_round = self.policy.observe_draft
        self._arms: dict[int, SequenceArms] = {}
        self._by_model: set[int] = set()  # jobs whose proposals this step are the model's
        self._in_model: set[int] = set()  # jobs holding a draft-model slot (admitted when the model first drafts)
        # Skipping the choice where it speculated for nobody (module docstring): plans in a row that did, the steps
        # left to skip, and the batch size they were made at (0: no plan to go by).
        self.quiet_skip_max = quiet_skip_max
        self._quiet = 0
        self._skip = 0
        self._quiet_batch = 0
        self.skipped_steps = 0
        # What speculating realized per batch size, the step's own seconds from proposing to the verdict: the
        # policy's estimates, right on average, have errors as large as its gains at a batch (module docstring).
        self.gate = RealizedGate()
        self.clock = time.perf_counter  # what a step's seconds are read from (tests give their own)
        self._step: _StepRecord | None = None  # the step in flight: observed into the gate at the next one

    @property
    def passes(self) -> int:
        return int(self.model.passes) if self.model is not None else 0

    @property
    def free(self) -> int:
        return UNLIMITED  # a job takes a draft-model slot only when the model first drafts for it

    def admit(self, job: Any) -> None:
        job.draft_state = self.kind
        self._arms[id(job)] = SequenceArms(reproducible=_reproducible(job.sampling))
        self.ngram.indexes.track(job)

    def release(self, job: Any, keep: bool = True) -> None:
        self._arms.pop(id(job), None)
        self.ngram.indexes.untrack(job)
        self._by_model.discard(id(job))
        if id(job) in self._in_model:
            self._in_model.discard(id(job))
            self.model.release(job, keep)
        job.draft_state = None

    def _model_ready(self, job: Any) -> bool:
        return self.model is not None and (id(job) in self._in_model or self.model.free > 0)

    def propose(self, jobs: list[Any], ks: list[int], batch_tokens: int = 0, batch_seqs: int = 0) -> list[Proposal]:
        t0 = time.perf_counter()
        batch = max(batch_seqs, len(jobs))
        shared = not any(self._arms[id(job)].reproducible for job in jobs)
        self._observe_step()
        # A decode step (every sequence of the pass feeds one token) is the gate's evidence; a prefill's cost is
        # paid whatever the choice. A batch with a seeded sequence is neither gated nor evidence.
        record = _StepRecord(batch, self.clock()) if shared and batch > 1 and batch_tokens == batch else None
        self._step = record
        if self._skip > 0 and shared and batch >= self._quiet_batch:
            self._skip -= 1
            self.skipped_steps += 1
            self.policy.record_plain(len(jobs))
            return [Proposal() for _ in jobs]
        if shared and batch > 1 and not self.gate.allows(batch):
            self.policy.record_plain(len(jobs))  # speculating has not paid at this batch size, as realized
            return [Proposal() for _ in jobs]
        found = [self.ngram.propose_one(job, k) for job, k in zip(jobs, ks)]
        ready = [self._model_ready(job) for job in jobs]
        asks = [
            Ask(k, p.tokens, p.match_len, r, max(1, len(job.pending)), self.model.lag(job) if r else 0)
            for job, k, p, r in zip(jobs, ks, found, ready)
        ]
        # Jobs of the batch that do not speculate feed tokens too: the step's cost grows from all of them.
        others = max(0, batch_tokens - sum(a.base_tokens for a in asks))
        if others and asks and not self._arms[id(jobs[0])].reproducible:
            asks[0] = dataclasses.replace(asks[0], base_tokens=asks[0].base_tokens + others)
        choices = self.policy.plan([self._arms[id(job)] for job in jobs], asks, batch_seqs=batch)
        if shared and batch > 1 and self.quiet_skip_max > 0 and not any(c.speculates for c in choices):
            self._skip = min(1 << min(self._quiet, 16), self.quiet_skip_max)
            self._quiet += 1
            self._quiet_batch = batch
        else:
            self._quiet = self._skip = 0
        out = [Proposal() for _ in jobs]
        to_model, model_ks = [], []
        for i, (choice, p) in enumerate(zip(choices, found)):
            if choice.source == NGRAM:
                out[i] = Proposal(p.tokens[: choice.k], p.match_len, p.source)
            elif choice.source == MODEL:
                if id(jobs[i]) not in self._in_model:  # its cache catches up on the whole sequence in round 0
                    if self.model.free == 0:
                        continue  # the last slot went to another job of this step: a plain step
                    self.model.admit(jobs[i])
                    self._in_model.add(id(jobs[i]))
                to_model.append(i)
                model_ks.append(choice.k)
        self._by_model |= finish_proposals(self.model, jobs, out, to_model, model_ks, t0)
        if record is not None:
            record.speculated = any(p.tokens for p in out)
        return out

    def _observe_step(self) -> None:
        """The last step's record, complete (timed to its verdict, its tokens committed), into the gate."""
        record, self._step = self._step, None
        if record is not None and record.seconds > 0:
            self.gate.observe(record.seqs, record.speculated, record.tokens, record.seconds)

    def commit(self, job: Any, history_before: int, proposed: int, accepted: int) -> None:
        if self._step is not None:
            self._step.tokens += accepted + 1
        arms = self._arms.get(id(job))
        if arms is not None:
            self.policy.verdict(arms, proposed, accepted)
        by_model = id(job) in self._by_model
        self._by_model.discard(id(job))
        if id(job) in self._in_model:
            self.model.commit(job, history_before, proposed if by_model else 0, accepted if by_model else 0)

    def observe_pass(self, tokens: int, seconds: float, rows: int = 0, verify_s: float = 0.0, seqs: int = 1) -> None:
        if self._step is not None and self._step.seconds > 0:
            self._observe_step()  # a step without proposals (no job asked): the last one's record is complete
        elif self._step is not None:  # the step's time from proposing to the verdict (its commits come next)
            self._step.seconds = self.clock() - self._step.start
        self.policy.observe_target(tokens, seconds, seqs=seqs)
        if rows > 0:
            self.policy.observe_verify(rows, verify_s)


@dataclasses.dataclass
class _StepRecord:
    """One engine step as the gate weighs it: the sequences of its pass, whether any speculated, the tokens it
    committed and its seconds from proposing to the verdict (0 until the pass was timed)."""

    seqs: int
    start: float
    speculated: bool = False
    tokens: int = 0
    seconds: float = 0.0


@dataclasses.dataclass
class LocalSequence(SequenceArms):
    """One BLS request's evidence per arm (SequenceArms) and what its step asks of the shared target pass: the tokens
    its target call feeds (its prompt on the first step), of which a decode step's (1 + K), and the tokens it is
    expected to commit; and the pass it was planned in (tokens and sequences of every request in flight then)."""

    feed: int = 1
    decode_feed: int = 1
    expected: float = 1.0
    pass_tokens: int = 0
    pass_seqs: int = 1
    planned: bool = False  # this step was planned (the last step of an answer has no room for a draft: not)
    quiet: int = 0  # plans in a row that did not speculate
    run: int = 1  # the tokens this step's target call generates when it does not speculate (a plain stretch)
    verdict_at: float = 0.0  # perf_counter at its last verdict (0: none yet)
    index: PromptIndex | None = None  # its sequence's prompt-lookup index (trtspec.speculative.drafters.ngram)


class AdaptiveLocalDrafter:
    """The BLS orchestrator's adaptive drafter (trtspec.speculative.drafters.LocalDrafter): n-gram tokens from this
    process, or a number of tokens to ask the draft engine for (``has_model``), or none.

    The orchestrator runs each request's loop on its own, but the target engine batches the calls of every request
    in flight into one pass, so a request's draft slows the others' steps too. Each request is planned with the
    others in flight as they last chose (``OtherSequences``: their tokens grow the pass, their expected tokens count
    in the step's rate), and a step's seconds (from the request's last verdict, less the draft engine's call) are
    learned as a pass over every in-flight request's tokens (the batch's curve), not over this request's alone: at
    concurrency 8 a call's latency is the whole batched step, and learned as one sequence's it made every draft look
    free. A plan that speculates for nobody steps aside for a plain stretch (module docstring). The draft engine's
    seconds per round are learned from its calls' latency (``verdict``'s ``draft_s``)."""

    kind = DrafterKind.ADAPTIVE

    def __init__(
        self,
        ngram: NgramDrafter,
        *,
        has_model: bool,
        policy: AdaptivePolicy | None = None,
        plain_run_max: int = 16,
        batch_run: int = 64,
        gated_run: int = 128,
    ) -> None:
        self.ngram = ngram
        self.has_model = has_model
        self.policy = policy or AdaptivePolicy()
        self.plain_run_max = max(1, plain_run_max)
        self.batch_run = max(1, batch_run)
        self.gated_run = max(1, gated_run)
        # What speculating realized per batch size, a request's own time from verdict to verdict: the policy's pass
        # model does not see a BLS call's wait for the batch's step boundary (trtspec.speculative.gate).
        self.gate = RealizedGate()
        self.clock = time.perf_counter  # what a step's seconds are read from (simulations give their own)
        self._live: dict[int, LocalSequence] = {}  # the requests in flight (new_state .. finish)

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def new_state(self, sampling: Any = None) -> LocalSequence:
        state = LocalSequence(reproducible=_reproducible(sampling), feed=0, index=self.ngram.new_state())
        self._live[id(state)] = state
        return state

    def finish(self, state: Any) -> None:
        """The request ended (or failed): it no longer shares the target's passes."""
        self._live.pop(id(state), None)

    def _others(self, state: LocalSequence) -> OtherSequences:
        others = [s for s in self._live.values() if s is not state]
        return OtherSequences(
            seqs=len(others),
            tokens=sum(max(1, s.feed) for s in others),
            decode_tokens=sum(s.decode_feed for s in others),
            expected=sum(s.expected for s in others),
        )

    def plan(self, state: LocalSequence, seq: Sequence[int], k: int) -> tuple[list[int] | None, int]:
        own = len(seq) if state.feed == 0 else 1  # the first call feeds the prompt (the engine caches it after)
        others = self._others(state)
        # at a batch only: alone, a call waits for no other request's step, and the pass model prices it as it is
        gated = bool(others.seqs) and not state.reproducible and not self.gate.allows(others.seqs + 1)
        if gated:
            self.policy.record_plain(1)  # speculating has not paid at this batch size, as realized: a plain step
            tokens: list[int] = []
            choice = NO_SPECULATION
        else:
            p = self.ngram.propose(seq, k, state.index)
            tokens = list(p.tokens[:k])
            ask = Ask(k, tokens, p.match_len, self.has_model, own)
            (choice,) = self.policy.plan([state], [ask], batch_seqs=others.seqs + 1, others=others)
        chosen = choice.k if choice.speculates else 0
        state.feed, state.decode_feed = own + chosen, 1 + chosen
        state.expected = 1.0 + (self.policy.expected(state, choice.arm, chosen) if choice.arm and chosen else 0.0)
        state.pass_tokens, state.pass_seqs = state.feed + others.tokens, others.seqs + 1
        state.planned = True
        if choice.speculates:
            state.quiet, state.run = 0, 1
        else:  # step aside for a stretch (module docstring): 2, 4, 8 ... plain tokens in one call, at a batch more
            alone = others.seqs == 0 or state.reproducible
            ramp = min(2 << min(state.quiet, 16), self.plain_run_max)
            state.run = self.gated_run if gated else ramp if alone else self.batch_run
            state.quiet += 1
        if choice.source == MODEL:
            return None, choice.k
        return (tokens[: choice.k] if choice.source == NGRAM else []), 0

    def plain_run(self, state: LocalSequence) -> int:
        """Tokens the target generates in this step's call, the plan having proposed nothing (module docstring)."""
        return state.run if state.planned else 1

    def verdict(
        self,
        state: LocalSequence,
        proposed: int,
        accepted: int,
        target_s: float = 0.0,
        draft_s: float = 0.0,
        plain_tokens: int = 0,
    ) -> None:
        model_k = state.last[1] if state.last is not None and state.last[0][0] == MODEL else 0
        self.policy.verdict(state, proposed, accepted)
        # What the step cost this request: from its last verdict to this one, less the draft engine's call. The
        # target call's latency alone leaves out the loop's turnaround (sending the tokens on, planning, sending
        # the next call), which every step pays and a plain stretch pays once for all its tokens.
        now = self.clock()
        since = now - state.verdict_at if state.verdict_at > 0 else 0.0
        if target_s > 0 and since > 0:
            target_s = max(target_s, since - draft_s)
        state.verdict_at = now
        if state.feed > state.decode_feed:  # it fed the prompt, whose cost is unknown here (the engine may reuse
            target_s = since = 0.0  # its prefix from another request's cache): not a pass of state.pass_tokens
        if state.planned and since > 0 and state.pass_seqs > 1 and not state.reproducible:  # the gate's evidence
            self.gate.observe(state.pass_seqs, proposed > 0, plain_tokens if plain_tokens > 1 else accepted + 1, since)
        if plain_tokens > 1:  # a plain stretch: one plan, ``plain_tokens`` target steps
            self.policy.record_plain(plain_tokens - 1)
            if target_s > 0:  # a plain token's cost there
                self.policy.observe_target(state.pass_tokens, target_s / plain_tokens, seqs=state.pass_seqs)
            state.feed = state.decode_feed
            state.planned = False
            return
        if not state.planned:  # a step without a plan: the target alone, its own token in the pass of the others
            others = self._others(state)
            state.feed = state.decode_feed = 1
            state.pass_tokens, state.pass_seqs = 1 + others.tokens, others.seqs + 1
        if target_s > 0:  # one target call verifying ``proposed`` tokens, in a pass with the others in flight
            self.policy.observe_target(max(state.pass_tokens, proposed + 1), target_s, seqs=state.pass_seqs)
        if draft_s > 0 and model_k:
            self.policy.observe_draft(1, draft_s / model_k)  # one draft engine call of model_k tokens
        # Until its next plan the others take it as choosing as it just did, without its prompt.
        state.feed = state.decode_feed
        state.planned = False
