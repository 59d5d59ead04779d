"""Adaptive speculation: per sequence and per step, choose the drafter (draft model, n-grams or none) and K so that the
expected tokens per unit of cost are highest, from what this server measures.

Two things are learned online, from the decoding loop itself:

- **Acceptance** per *arm* (``("ngram", match length)`` or ``("model", 0)``; trtspec.speculative.arms): the chance
  that a step's first proposal is accepted, and that a later one is given the one before it was (``Rate``: they
  differ, an n-gram that starts right is usually inside a quote), as counts per sequence weighted toward its recent
  steps (each observation of an arm shrinks its older evidence by ``recency``) over a prior shared by every sequence
  of the server (``AcceptanceTracker``). Evidence also fades slowly while an arm is not used (``idle_decay`` per
  step), and alone a sequence's estimate carries an exploration bonus that grows as its evidence fades, so a sequence
  that switched an arm off tries it again some tens of steps later (in a batch there is no bonus: an exploring draft
  would cost every sequence of the pass; a faded estimate returns to the shared prior); a long n-gram match (a quote,
  a repeat) has its own arm and its own prior, so such text is speculated on at once.
- **Costs**: seconds of one packed target pass as a function of the tokens it feeds, of verifying it (the vocabulary
  head and the acceptance routine, per head row computed; a draft's later rows are charged with its first
  proposal's acceptance) and of one draft-model round as a function of its rows (``PassCosts``: the machine's drift
  times a shape per size, fitted non-decreasing, interpolated between sizes), learned from every pass; where a
  size has not been seen they follow a prior curve (``c`` and ``v`` from ``trtspec tune`` / ``--costs``, or CPU-like
  defaults) anchored at the nearest measured size. A sequence alone takes the largest K its drafter offers, once,
  when that pass size has gone unmeasured for a while, so that a size priced high in a slow stretch is timed again.

The choice (``AdaptivePolicy.plan``) is marginal analysis over the whole batch, by Dinkelbach's iteration for the
best ratio of expected tokens to seconds (trtspec.speculative.choice prices it); this module decides what it is priced
against (a plain decode step of the pass, timed again when stale) and learns what it is priced on. At concurrency 1 it
maximizes the request's own speed; at high concurrency the plain step is shared by many sequences, its rate is high,
and speculation backs off by itself.

Exactness: the choice depends only on committed tokens, earlier verdicts and the n-gram's proposal (a function of the
committed tokens), never on this step's target logits, so greedy output stays the target's and rejection sampling
stays exact whatever is chosen. Pure Python (no torch, no numpy): the in-flight engine and the BLS orchestrator
share it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from trtspec.speculative.arms import (
    DEFAULT_PRIORS,
    MODEL,
    NGRAM,
    AcceptanceTracker,
    Arm,
    Rate,
    SequenceArms,
    expected_accepted,
)
from trtspec.speculative.choice import NO_SPECULATION, Ask, Choice, Curves, OtherSequences, PlainStep, StepChoice
from trtspec.speculative.pass_costs import BatchPassCosts, CostPrior, PassCosts, convex_minorant


class AdaptivePolicy:
    """The choice of drafter and K per sequence and step (see the module docstring). One per engine or orchestrator;
    not thread-safe (the engine thread, or one event loop)."""

    def __init__(
        self,
        *,
        prior: CostPrior | None = None,
        priors: dict[Arm, float] | None = None,
        recency: float = 0.8,
        idle_decay: float = 0.97,
        explore: float = 0.08,
        min_gain: float = 0.0,
        batch_margin: float = 0.03,
        retime_plain: int = 64,
    ) -> None:
        self.prior = prior or CostPrior()
        self.tracker = AcceptanceTracker(priors=dict(priors or DEFAULT_PRIORS))
        self.target = BatchPassCosts(self.prior.target)
        self.draft = PassCosts(self.prior.draft, scale_from=self.target)
        self.verify = PassCosts(self.prior.verify, scale_from=self.target)  # by rows verified
        self.recency = recency  # an arm's evidence in a sequence shrinks by this at each new observation of it
        self.idle_decay = idle_decay  # ... and by this every step, so that an arm left long ago is tried again
        # The bonus is for a sequence alone (or seeded, whose choices must not depend on the batch). In a batch an
        # exploring draft costs every sequence of the step its extra pass time, and the long matches that pay there
        # are found without it: in process, 8 workload conversations at a time, adaptive read 1.016-1.072x
        # target-only without the bonus in a batch, 1.001-1.007x with it (three runs and two, 2 rounds each).
        self.explore = explore
        self._in_batch = False  # the plan being made is for a pass of several sequences
        self._estimates: dict[tuple[int, Arm, bool], float] | None = None  # during a plan: acceptance estimates
        self.min_gain = min_gain
        # In a pass of several sequences, speculate only if the step's expected rate beats the plain step's by this
        # share: there the gain is a few per cent at best, the estimates' error is as large, and a plain step lets
        # the engine drafter skip its own work (trtspec.speculative.drafters.adaptive).
        self.batch_margin = batch_margin
        # A batch's plain decode pass is what every draft is priced against; where the batch speculates on most
        # steps it is seldom timed, and its estimate keeps the machine's speed of whenever it last was (live curves
        # move every size by a shared drift, and the plain size's own shape stays). So it is timed again, one plain
        # step, when its batch size's curve has seen none among its last ``retime_plain`` passes.
        self.retime_plain = retime_plain
        # Counters for metrics: steps by what they did, and the K chosen.
        self.steps = {NGRAM: 0, MODEL: 0, "none": 0}
        self.k_chosen = [0] * 17
        self.calibrated: set[int] = set()  # the batch sizes whose pass costs were measured in turn at start

    # -- estimates ---------------------------------------------------------------------------------------------
    def acceptance(self, seq: SequenceArms, arm: Arm, later: bool = False) -> float:
        """The sequence's estimate of ``arm`` (its first proposal's acceptance; ``later``: a later one's given the one
        before it was accepted): its own decayed evidence over the server-wide prior (the starting prior alone for a
        reproducible sequence), plus a bonus for an arm it has little recent evidence of (so it comes back to an arm
        it left)."""
        memo = self._estimates
        if memo is not None:
            key = (id(seq), arm, later)
            hit = memo.get(key)
            if hit is None:
                hit = memo[key] = self._acceptance(seq, arm, later)
            return hit
        return self._acceptance(seq, arm, later)

    def _acceptance(self, seq: SequenceArms, arm: Arm, later: bool) -> float:
        prior = self.tracker.priors.get(arm, 0.3) if seq.reproducible else self.tracker.mean(arm, later)
        rate = seq.rates.get(arm)
        succ, trials = rate.counts(later) if rate is not None else (0.0, 0.0)
        first = rate.trials if rate is not None else 0.0  # the bonus follows the arm's evidence, not the position's
        weight = 3.0
        mean = (prior * weight + succ) / (weight + trials)
        explore = 0.0 if self._in_batch and not seq.reproducible else self.explore
        return min(0.99, mean + explore / (1.0 + first))

    def continuation(self, seq: SequenceArms, arm: Arm) -> float:
        return self.acceptance(seq, arm, later=True)

    def expected(self, seq: SequenceArms, arm: Arm, k: int) -> float:
        """Expected accepted proposals of ``k`` from ``arm`` for this sequence."""
        return expected_accepted(self.acceptance(seq, arm), k, self.continuation(seq, arm))

    # -- the choice --------------------------------------------------------------------------------------------
    def plan(
        self,
        seqs: Sequence[SequenceArms],
        asks: Sequence[Ask],
        batch_seqs: int | None = None,
        others: OtherSequences | None = None,
    ) -> list[Choice]:
        """One choice per sequence for this step (see the module docstring); ``batch_seqs``: the sequences the
        step's pass feeds (default: these); ``others``: the sequences of the pass planned elsewhere, whose choices
        are taken as they are (their tokens grow the pass, their expected tokens count in the step's rate)."""
        # Within a plan no estimate changes: each (sequence, arm) is estimated once, not for every K and iteration.
        self._estimates = {}
        try:
            return self._plan(seqs, asks, batch_seqs, others)
        finally:
            self._estimates = None

    def _plan(
        self,
        seqs: Sequence[SequenceArms],
        asks: Sequence[Ask],
        batch_seqs: int | None,
        others: OtherSequences | None,
    ) -> list[Choice]:
        shared = [i for i, s in enumerate(seqs) if not s.reproducible]
        out: list[Choice] = [NO_SPECULATION] * len(seqs)
        n_base = sum(max(1, a.base_tokens) for a in asks)
        b = max(len(seqs) + (others.seqs if others is not None else 0), batch_seqs or 0)
        self._in_batch = b > 1
        chosen = self._ratio_best(
            [seqs[i] for i in shared], [asks[i] for i in shared], n_base, batch_seqs=b, others=others
        )
        for i, choice in zip(shared, chosen):
            out[i] = choice
        for i, (seq, ask) in enumerate(zip(seqs, asks)):
            if seq.reproducible:  # alone, on the prior costs (relative units: a one-token target pass is 1)
                (out[i],) = self._ratio_best([seq], [ask], max(1, ask.base_tokens), prior=True)
        for seq, best in zip(seqs, out):
            seq.last = (best.arm, best.k) if best.speculates and best.arm is not None else None
            self.steps[best.source if best.speculates and best.source else "none"] += 1
            self.k_chosen[min(best.k, 16)] += 1
        return out

    def record_plain(self, n: int) -> None:
        """Count ``n`` sequences' steps that did not speculate without a plan of their own (the engine drafter
        skipped planning, or they were a BLS plain stretch's steps after its first)."""
        self.steps["none"] += n
        self.k_chosen[0] += n

    def _ratio_best(
        self,
        seqs: Sequence[SequenceArms],
        asks: Sequence[Ask],
        n_base: int,
        prior: bool = False,
        batch_seqs: int = 1,
        others: OtherSequences | None = None,
    ) -> list[Choice]:
        """The choices that maximize the step's expected tokens per second (trtspec.speculative.choice), on the
        prior curves (``prior``) or the live ones, against a plain decode step of this batch; none where that step
        is to be timed first, or where in a batch the choices would not beat it by the margin."""
        costs = (
            Curves(self.prior.target, self.prior.draft, self.prior.verify, self.prior.target)
            if prior
            else Curves(
                self.target.curve(batch_seqs).cost, self.draft.cost, self.verify.cost, self.target.curve(1).cost
            )
        )
        if not seqs:
            return []
        # What speculation is priced against: the rate of a plain decode step (one token per sequence of the pass),
        # not this step's own when it also feeds a prompt. A prefill's tokens give no output yet, so such a step's
        # own rate is low, and against it a draft token that costs as many milliseconds as in any other step looked
        # worth taking at almost any acceptance. The prefill is paid whatever the choice: the time a draft adds is
        # worth what the engine makes of time in decode steps (the long-run rate). At 8 sequences a prefill step
        # that plans is rare (the engine drafter skips most: 3 of 72 planned steps through Triton in one run, 21
        # sequences speculating in them), so this corrects the price more than it moves a benchmark.
        n_ref = min(n_base, max(batch_seqs, len(seqs)))
        # What the step commits without these sequences' drafts: a token each, and what the others expect.
        base_yield = float(len(seqs))
        margin = self.batch_margin
        if others is not None and others.seqs > 0 and not prior:
            # Sequences planned elsewhere share the pass (the BLS orchestrator's requests in one engine step): a
            # draft here grows the pass they all wait for, so it is priced at the whole step's rate, not at this
            # sequence's own (measured through Triton, BLS, 8 requests: planned alone on their own calls' latency,
            # every request found speculation cheap and the server ran at 0.56x target-only). The margin is the
            # batch's, shared per sequence: the whole step's rate is what it is asked of.
            n_ref = min(n_base, len(seqs)) + others.decode_tokens
            n_base += others.tokens
            base_yield += others.expected
            margin *= len(seqs) / max(1, batch_seqs)
        if not prior and batch_seqs > 1 and not self.target.measured(n_ref, batch_seqs, within=self.retime_plain):
            # A batch's plain decode pass not timed yet: every choice below is priced against it, and estimated from
            # the passes it has seen (all speculative, so larger) it looks dearer than it is and speculation cheaper
            # (measured, 8 sequences, bfloat16: its curve knew 12-16 tokens only, and the policy kept speculating at
            # 0.9x target-only). One plain step times it.
            return [NO_SPECULATION] * len(seqs)
        costs = costs.priced_once()  # the curves do not change within a plan
        # A plain decode step: the target's pass over one token per sequence, one row verified per sequence; a draft's
        # extra cost is the pass's growth from the tokens this step feeds anyway (n_base, prompts included).
        t_base = costs.target(n_ref) + costs.verify(len(seqs))
        if t_base <= 0:
            return [NO_SPECULATION] * len(seqs)
        step = PlainStep(t_base, n_base, base_yield)
        pricing = StepChoice(self, costs, step, self.min_gain)
        choices = pricing.best_ratio(seqs, asks)
        if len(seqs) > 1:
            # The pass's cost can step up where a batch first feeds more than its plain tokens (measured, bfloat16, 8
            # sequences: 8 tokens 63 ms, 9 tokens 90): then no single sequence's draft pays for the step, though
            # every sequence's together would. Choosing on the cost's convex minorant spreads the step over all of
            # them; of the two choices, the one whose expected rate on the real costs is higher is taken.
            top = n_base + sum(max(0, a.k_max) for a in asks)
            hull = dataclasses.replace(costs, target=convex_minorant(costs.target, n_base, top))
            alt = StepChoice(self, hull, step, self.min_gain).best_ratio(seqs, asks)
            if alt != choices and pricing.rate(seqs, alt) > pricing.rate(seqs, choices):
                choices = alt
        if not prior and batch_seqs == 1 and n_base == 1:
            choices = [self._retime_top(asks[0], choices[0])]
        if batch_seqs > 1 and not prior and any(c.speculates for c in choices):
            plain = step.base_yield / t_base
            if pricing.rate(seqs, choices) < plain * (1 + margin):
                return [NO_SPECULATION] * len(seqs)
        return choices

    def _retime_top(self, ask: Ask, choice: Choice) -> Choice:
        """A decode step alone that speculates: the most tokens its drafter offers, once, when a pass of that size
        has not been timed for a while (``STALE_PASSES``), so that its price is measured again. A size whose
        passes all fell in one slow stretch of the machine stays priced high, and the policy does not choose it
        again to learn otherwise (measured, the workload benchmark: the 5-token pass of K 4 learned at 19.8 ms
        against 15.5 for 4 tokens, timed 22.4 against 21.1; K 3 on 89 % of the steps, 3 % fewer tokens per step
        than n-grams at K 4 on retrieval-grounded QA). Costs one step in some 64 a K a little past the best; a size
        whose re-timing found it as dear as priced waits longer each time (trtspec.speculative.pass_costs)."""
        if not choice.speculates:
            return choice
        top = min(ask.k_max, len(ask.ngram_tokens)) if choice.source == NGRAM else ask.k_max
        if choice.k >= top or self.target.fresh(1 + top, 1):
            return choice
        return dataclasses.replace(choice, k=top)

    # -- feedback ----------------------------------------------------------------------------------------------
    def anchor(self, target: dict[int, dict[int, float]], draft: dict[int, float] | None = None) -> None:
        """Take the cost curves' shapes from a controlled measurement (trtspec.runtimes.torch.costs.calibrate):
        ``target``: per number of sequences, seconds of a pass by tokens fed; ``draft``: seconds of a draft round by
        rows. Live passes then only tell how far each curve has drifted (trtspec.speculative.pass_costs)."""
        self.target.anchor(target)
        if draft:
            self.draft.anchor(draft)
        self.calibrated |= {int(b) for b in target}

    def verdict(self, seq: SequenceArms, proposed: int, accepted: int) -> None:
        """After the target's verdict on the step ``plan`` chose for ``seq``: learn from it, decay old evidence."""
        seq.decay(self.idle_decay)
        seq.steps += 1
        if seq.last is not None and proposed > 0:
            arm, _ = seq.last
            rate = seq.rates.setdefault(arm, Rate())
            rate.decay(self.recency)
            rate.add(proposed, accepted)
            if not seq.reproducible:  # a reproducible sequence's verdicts must not change the others' choices either
                self.tracker.observe(arm, proposed, accepted)
        seq.last = None

    def observe_target(self, tokens: int, seconds: float, seqs: int = 1) -> None:
        """Seconds of a target pass that fed ``tokens`` tokens of ``seqs`` sequences."""
        self.target.observe(tokens, seconds, seqs)

    def observe_draft(self, rows: int, seconds: float) -> None:
        self.draft.observe(rows, seconds)

    def observe_verify(self, rows: int, seconds: float) -> None:
        """Seconds of verifying a pass's ``rows`` (the vocabulary head and the acceptance routine)."""
        self.verify.observe(rows, seconds)

    def snapshot(self) -> dict[str, Any]:
        """What the policy has learned (for metrics and logs)."""
        total = sum(self.steps.values())
        return {
            "steps": dict(self.steps),
            "no_speculation_share": round(self.steps["none"] / total, 4) if total else 0.0,
            "k_chosen": {k: n for k, n in enumerate(self.k_chosen) if n},
            # per arm: the first proposal's acceptance, and a later one's given the one before was accepted
            "acceptance": {f"{s}:{m}": round(self.tracker.mean((s, m)), 4) for s, m in sorted(self.tracker.rates)},
            "acceptance_next": {
                f"{s}:{m}": round(self.tracker.mean_next((s, m)), 4) for s, m in sorted(self.tracker.rates)
            },
            # per number of sequences in the pass: seconds by tokens fed (measured, and the fit used)
            "target_pass_s": {b: {n: round(t, 5) for n, t in c.items()} for b, c in self.target.seconds.items()},
            "target_pass_fit_s": {b: {n: round(t, 5) for n, t in c.items()} for b, c in self.target.fitted.items()},
            "draft_round_s": {b: round(s, 5) for b, s in sorted(self.draft.seconds.items())},
            # anchored (measured in turn at start): the shapes, and how far live passes ran from them
            "target_anchor_s": {
                b: {n: round(t, 5) for n, t in c.anchored.items()} for b, c in sorted(self.target.anchors.items())
            },
            "target_drift": round(self.target.drift, 4),
            "draft_anchor_s": {n: round(t, 5) for n, t in self.draft.anchored.items()},
            "draft_drift": round(self.draft.drift, 4),
            "verify_s": {b: round(s, 5) for b, s in sorted(self.verify.seconds.items())},
        }
