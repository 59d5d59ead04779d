"""A gate on what speculating realized: per batch size, the tokens per second a request got from the steps it
speculated on against the steps it did not, as the request saw them (from one verdict to the next: the engine call,
its wait for a step boundary of the batch, the loop's turnaround).

Why, in the BLS orchestrator (trtspec.speculative.drafters.adaptive.AdaptiveLocalDrafter): the policy prices a draft
on a model of the target's pass (its seconds by tokens fed), and a BLS step is more than a pass. At concurrency 8 on
the 2-core CPU a speculative step is its own engine call, which waits for the batch's next step boundary and is
admitted anew, while a request that does not speculate streams a plain stretch of tokens from one call. Measured
through Triton (example pair, 16 requests of 48 tokens, metrics scraped around each run): the drafter speculated on
22 then 56 of some 745 steps at acceptance 0.12-0.46, and read 0.97x then 0.84x target-only; the policy's pass
model did not see the call's cost. The gate closes where the speculative steps' realized rate is below the plain
steps' and lets one plan in ``probe_every`` through to keep measuring, so the sequence comes back when speculating
pays again (a quote, a code block; or the batch shrinks: each batch size has its own evidence).

Exactness is untouched: the gate depends only on earlier steps' timings and verdicts, never on this step's target
output. A reproducible (seeded sampled) request is not gated (the caller's rule): its choices must not depend on
timings. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trtspec.speculative.pass_costs import BatchPassCosts

# Each kind's evidence fades by its own observations: the last ~20 speculative steps against the last ~20 plain ones
# (a kind observed rarely, as speculation is once the gate closes, keeps its evidence until it is observed again).
GATE_DECAY = 0.95
GATE_MIN_SPEC = 5.0  # speculative steps (decayed: about 6) before the gate may close
GATE_MIN_PLAIN = 2.0  # plain observations (a stretch is one) before the gate may close


@dataclass
class _Sums:
    """One kind of step's decayed tokens, seconds and observations."""

    tokens: float = 0.0
    seconds: float = 0.0
    n: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = self.tokens * GATE_DECAY + tokens
        self.seconds = self.seconds * GATE_DECAY + seconds
        self.n = self.n * GATE_DECAY + 1.0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Realized:
    """One batch size's evidence: its speculative steps and its plain ones."""

    spec: _Sums = field(default_factory=_Sums)
    plain: _Sums = field(default_factory=_Sums)
    gated: int = 0  # plans the closed gate has seen (every ``probe_every``-th goes through)
    unweighed: int = 0  # plans seen while only speculative steps were measured (every ``probe_every``-th is plain)

    @property
    def closed(self) -> bool:
        if self.spec.n < GATE_MIN_SPEC or self.plain.n < GATE_MIN_PLAIN:
            return False
        return self.spec.rate < self.plain.rate


class RealizedGate:
    """Per batch size (BatchPassCosts' buckets), whether speculating has paid as realized (module docstring)."""

    def __init__(self, probe_every: int = 8) -> None:
        self.probe_every = max(1, probe_every)
        self._by_batch: dict[int, _Realized] = {}
        self.closed_plans = 0  # plans the gate kept from speculating

    def _at(self, seqs: int) -> _Realized:
        return self._by_batch.setdefault(BatchPassCosts.bucket(seqs), _Realized())

    def allows(self, seqs: int) -> bool:
        """Whether a plan in a pass of ``seqs`` sequences may speculate (a closed gate passes every
        ``probe_every``-th plan, so that its evidence stays current; with speculative steps measured and no plain
        ones, every ``probe_every``-th plan is kept plain, so that there is something to weigh them against)."""
        r = self._at(seqs)
        if r.spec.n >= GATE_MIN_SPEC and r.plain.n < GATE_MIN_PLAIN:
            # a policy that always speculates here leaves nothing to weigh its steps against: a plain probe
            r.unweighed += 1
            return r.unweighed % self.probe_every != 0
        if not r.closed:
            return True
        r.gated += 1
        if r.gated % self.probe_every == 0:
            return True
        self.closed_plans += 1
        return False

    def observe(self, seqs: int, speculated: bool, tokens: int, seconds: float) -> None:
        """A step planned at ``seqs`` sequences committed ``tokens`` in ``seconds`` of the request's time."""
        if tokens > 0 and seconds > 0:
            r = self._at(seqs)
            (r.spec if speculated else r.plain).add(tokens, seconds)

    def snapshot(self) -> dict[int, dict[str, float | bool]]:
        """Per batch size: the realized rates (tokens/s) and whether the gate is closed."""
        out: dict[int, dict[str, float | bool]] = {}
        for b, r in sorted(self._by_batch.items()):
            out[b] = {"spec_tok_s": round(r.spec.rate, 2), "plain_tok_s": round(r.plain.rate, 2), "closed": r.closed}
        return out
