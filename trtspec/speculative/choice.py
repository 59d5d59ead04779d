"""One step's choice of drafter and K for a batch of sequences, on given cost curves and acceptance estimates: what
a plan is asked (``Ask``, ``OtherSequences``), what it answers (``Choice``) and how the answer is found
(``StepChoice``). The adaptive policy (trtspec.speculative.adaptive) learns the estimates and the curves and decides
what the choice is priced against; this module only prices.

The choice is marginal analysis over the whole batch: a decode step without speculation yields one token per sequence
in T(b) seconds, a rate R = b / T(b) (in a step that also prefills a prompt, still this rate: the prefill is paid
whatever the choice, and a draft's extra cost is the growth of that step's larger pass). A sequence's option (arm, k)
gains E(a, k) = a + a^2 + ... + a^k expected extra tokens for its extra cost (the target pass over k more tokens and
their verification, plus k draft rounds for the model); each sequence takes its option of best net gain E - R * extra,
if any beats the rate. R is then raised to the rate those choices achieve, (b + sum E) / (T(b) + extra), and the
choice made again until R holds (Dinkelbach's iteration for the best ratio: choosing at the plain step's rate alone
takes K that add tokens but lower the step's rate). At concurrency 1 this maximizes the request's own speed; at high
concurrency T(b) is shared by many sequences, R is high, and speculation backs off by itself.

Pure Python (no torch, no numpy).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trtspec.speculative.arms import MODEL, MODEL_ARM, NGRAM, Arm, SequenceArms, expected_accepted, ngram_arm


@dataclass(frozen=True)
class Ask:
    """One sequence's situation this step: how many tokens it may propose, the n-gram's proposal (free to compute:
    a lookup), whether the draft model can draft for it, and how many tokens it feeds anyway."""

    k_max: int
    ngram_tokens: Sequence[int] = ()
    ngram_match: int = 0
    model: bool = False
    base_tokens: int = 1
    # Tokens the draft model's cache must take in before it drafts (the whole sequence when it has never drafted
    # for it; a token or two when it drafted the step before): that catch-up is charged to the model's option.
    model_lag: int = 0


@dataclass(frozen=True)
class Choice:
    """What a sequence does this step: ``k`` tokens from ``source`` (``ngram``/``model``), or none (k 0)."""

    source: str | None = None
    k: int = 0
    arm: Arm | None = None

    @property
    def speculates(self) -> bool:
        return self.k > 0 and self.source is not None


NO_SPECULATION = Choice()


@dataclass(frozen=True)
class OtherSequences:
    """The sequences that share a pass with the ones being planned but are planned elsewhere (the BLS orchestrator
    plans each request alone, while the target engine batches every request in flight): how many, the tokens they
    feed (a prompt's included), the tokens a decode step of theirs feeds (1 + their K: what the plain step is priced
    on), and the tokens they are expected to commit."""

    seqs: int = 0
    tokens: int = 0
    decode_tokens: int = 0
    expected: float = 0.0


@dataclass(frozen=True)
class Curves:
    """The cost curves a choice is made on: seconds (or relative units) by tokens fed, draft rows, rows verified."""

    target: Callable[[int], float]
    draft: Callable[[int], float]
    verify: Callable[[int], float]
    alone: Callable[[int], float]  # the target's pass over one sequence's tokens (what a draft's catch-up is priced on)

    def priced_once(self) -> Curves:
        """These curves remembering their values: for one plan, whose curves are fixed (at 8 sequences the choice asks
        the same few dozen sizes some 1,200 times, 0.8 ms of a 37 ms step when each went through the interpolation)."""
        return Curves(*(_memo(f) for f in (self.target, self.draft, self.verify, self.alone)))


@dataclass(frozen=True)
class PlainStep:
    """A plain step, as a choice is priced against it: its seconds, the tokens it feeds, the tokens it commits."""

    t_base: float
    n_base: int
    base_yield: float


class Estimates(Protocol):
    """A sequence's acceptance estimates for an arm (trtspec.speculative.adaptive.AdaptivePolicy)."""

    def acceptance(self, seq: SequenceArms, arm: Arm, later: bool = False) -> float: ...

    def continuation(self, seq: SequenceArms, arm: Arm) -> float: ...

    def expected(self, seq: SequenceArms, arm: Arm, k: int) -> float: ...


Option = tuple[Choice, float, float]  # a choice, its expected extra tokens E, its extra cost


class StepChoice:
    """The best choices of one step on ``curves`` against the plain step ``step`` (the module docstring), with the
    acceptance ``estimates``; an option must gain more than ``min_gain`` net. One per plan and set of curves."""

    def __init__(self, estimates: Estimates, curves: Curves, step: PlainStep, min_gain: float = 0.0) -> None:
        self.est = estimates
        self.curves = curves
        self.step = step
        self.min_gain = min_gain
        self._options: dict[tuple[Any, ...], list[Option]] = {}

    def best_ratio(self, seqs: Sequence[SequenceArms], asks: Sequence[Ask]) -> list[Choice]:
        """The choices that maximize the step's expected tokens per second (b + sum E) / (T(n) + extra), by
        Dinkelbach's iteration: choose per sequence at the rate R, then raise R to the rate those choices achieve and
        choose again, until it holds. Choosing at the plain step's rate b / T(n) alone would over-speculate: an
        option that gains more tokens than it costs at that rate can still lower the rate the step achieves (a long
        K whose last tokens are rarely accepted)."""
        rate = self.step.base_yield / self.step.t_base
        if len(seqs) == 1:
            return [self._best_alone(seqs[0], asks[0], rate)]
        choices: list[Choice] = []
        for _ in range(6):
            choices = self.assign(seqs, asks, rate)
            achieved = self.rate(seqs, choices)
            if achieved <= rate * (1 + 1e-6):
                break
            rate = achieved
        return choices

    def _best_alone(self, seq: SequenceArms, ask: Ask, plain: float) -> Choice:
        """One sequence's best choice: its option of the highest ratio (base + E) / (T + extra), if that beats the
        plain step's rate ``plain`` (and gains more than ``min_gain`` net at it). Dinkelbach's iteration converges to
        this option, in two to four rounds of pricing every option again; a sequence alone (every step at
        concurrency 1) is planned in one."""
        step = self.step
        best, best_rate = NO_SPECULATION, plain
        for choice, gain, extra in self.options(seq, ask, step.n_base, 1, ()):
            r = (step.base_yield + gain) / (step.t_base + extra)
            if r > best_rate and gain - plain * extra > self.min_gain:
                best, best_rate = choice, r
        return best

    def rate(self, seqs: Sequence[SequenceArms], choices: Sequence[Choice]) -> float:
        """The expected tokens per second of a step that makes ``choices``."""
        costs, step = self.curves, self.step
        gain, n_now, rows, verify = 0.0, step.n_base, len(seqs), 0.0
        draft_rows: list[int] = []
        for seq, c in zip(seqs, choices):
            if not c.speculates:
                continue
            arm = c.arm or MODEL_ARM
            gain += self.est.expected(seq, arm, c.k)
            n_now += c.k
            verify += self.est.acceptance(seq, arm) * (costs.verify(rows + c.k) - costs.verify(rows))  # see options
            rows += c.k
            if c.source == MODEL:
                _add_rounds(draft_rows, c.k)
        extra = costs.target(n_now) - costs.target(step.n_base) + verify + sum(costs.draft(r) for r in draft_rows)
        return (step.base_yield + gain) / (step.t_base + extra)

    def assign(self, seqs: Sequence[SequenceArms], asks: Sequence[Ask], rate: float) -> list[Choice]:
        """Each sequence's best option at ``rate``, in turn (each on the pass as the ones before it grew it)."""
        n_now = self.step.n_base
        rows_now = len(seqs)  # head rows: one per sequence, plus the later rows of each draft
        draft_rows: list[int] = []  # draft rows per round chosen so far
        choices: list[Choice] = []
        for seq, ask in zip(seqs, asks):
            best, best_net = NO_SPECULATION, self.min_gain
            for choice, gain, extra in self.options(seq, ask, n_now, rows_now, draft_rows):
                net = gain - rate * extra  # the option's net gain at this rate
                if net > best_net:
                    best, best_net = choice, net
            if best.speculates:
                n_now += best.k
                rows_now += best.k
                if best.source == MODEL:
                    _add_rounds(draft_rows, best.k)
            choices.append(best)
        return choices

    def options(
        self, seq: SequenceArms, ask: Ask, n_now: int, rows_now: int, draft_rows: Sequence[int]
    ) -> list[Option]:
        """Each option of ``seq`` this step with its expected gain E and extra cost, in the order they are ranked
        (``n_now``: tokens the step feeds before this sequence's draft; ``rows_now``: rows it verifies;
        ``draft_rows``: rows per draft round). Neither depends on the rate, so they are priced once per pass they
        would grow (Dinkelbach's iterations ask again at each rate: at one sequence every iteration asks the same)."""
        key = (id(seq), id(ask), n_now, rows_now, tuple(draft_rows))
        hit = self._options.get(key)
        if hit is not None:
            return hit
        out = self._options[key] = self._price(seq, ask, n_now, rows_now, draft_rows)
        return out

    def _price(self, seq: SequenceArms, ask: Ask, n_now: int, rows_now: int, draft_rows: Sequence[int]) -> list[Option]:
        top = ask.k_max if ask.model else min(ask.k_max, len(ask.ngram_tokens))
        if top <= 0:
            return []
        costs, est = self.curves, self.est
        target, draft, verify = costs.target, costs.draft, costs.verify
        t0, v0 = target(n_now), verify(rows_now)
        # The target pass grown by k tokens, and the verification by the k later head rows, which are computed when
        # the first proposal is accepted (probability a; trtspec.speculative.acceptance.decide) and cost a second
        # multiply then. A curve of verification time by the rows a step kept instead charged a long K for what it
        # accepted, with the head run position by position: the K 4 steps, chosen where acceptance is high, were
        # those that computed the most rows (5.5 ms for one row, 9.2 ms for five, in one run), and K 4 cost some 3 ms
        # more than K 2 for being right.
        grow_t = [target(n_now + k) - t0 for k in range(top + 1)]
        grow_v = [verify(rows_now + k) - v0 for k in range(top + 1)]
        out: list[Option] = []
        if ask.ngram_tokens:
            arm = ngram_arm(ask.ngram_match)
            a, after = est.acceptance(seq, arm), est.continuation(seq, arm)
            for k in range(1, min(ask.k_max, len(ask.ngram_tokens)) + 1):
                out.append((Choice(NGRAM, k, arm), expected_accepted(a, k, after), grow_t[k] + a * grow_v[k]))
        if ask.model:
            a, after = est.acceptance(seq, MODEL_ARM), est.continuation(seq, MODEL_ARM)
            # The catch-up: a draft pass over the lagging tokens, priced as the target's pass over as many tokens
            # scaled by the draft's cost relative to the target's (one token of it is round 0's normal feed).
            lag = ask.model_lag
            # (one sequence's pass: the batch's curve would price a 40-token catch-up as 40 tokens spread over 8
            # sequences, and its one token as a batch's plain step).
            t1 = costs.alone(1)
            draft_extra = draft(1) / t1 * (costs.alone(lag) - t1) if lag > 2 and t1 > 0 else 0.0
            for k in range(1, ask.k_max + 1):
                rows = draft_rows[k - 1] if k - 1 < len(draft_rows) else 0
                draft_extra += draft(rows + 1) - draft(rows)
                gain = expected_accepted(a, k, after)
                out.append((Choice(MODEL, k, MODEL_ARM), gain, grow_t[k] + a * grow_v[k] + draft_extra))
        return out


def _add_rounds(draft_rows: list[int], k: int) -> None:
    """One more sequence drafting ``k`` rounds: a row more in each of its rounds."""
    for r in range(k):
        if r < len(draft_rows):
            draft_rows[r] += 1
        else:
            draft_rows.append(1)


def _memo(cost: Callable[[int], float]) -> Callable[[int], float]:
    """``cost`` (a function of an int size) remembering its values."""
    seen: dict[int, float] = {}

    def f(size: int) -> float:
        v = seen.get(size)
        if v is None:
            v = seen[size] = cost(size)
        return v

    return f
