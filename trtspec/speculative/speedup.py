"""What a drafter buys, exactly: per-position acceptance on the target's greedy answers, step costs, and the speedup
of every draft length K, predicted by simulating the decoder step by step.

Greedy speculative output is the target's greedy output, so on a reference answer the decoder's steps are fixed by
one number per answer position p: how many of the drafter's proposals from ``prompt + answer[:p]`` match
``answer[p:]`` (``MatchProfile``; capped at ``k_max``). From it, every K is simulated exactly as
``SpeculativeDecoder`` steps: ``k_eff = min(K, max_tokens - p - 1)`` proposals, ``min(L[p], k_eff)`` accepted plus the
target's own token, until the answer ends. A step's cost, in target steps: ``k_eff c`` for the draft, the target body
over ``k_eff + 1`` tokens, and its vocabulary head as the engine computes it (``StepCosts.head_computed``).

This module is pure Python (no torch): `trtspec tune`, the distill report and benchmarks share it; the torch side
(reference answers, match lengths, measured costs) is ``profiling`` and ``costs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trtspec.speculative.rules import MAX_DRAFT_LEN


@dataclass(frozen=True)
class StepCosts:
    """Costs in units of one target decode step (one token, full head).

    ``body[k]``: the target's forward over k + 1 tokens without its head (with ``head == 0``: the whole forward);
    ``head``: the head at one position; ``c``: one draft step; prefills: one request's prompt, mean.
    ``head_rows[n]``: the head over n rows in one multiply, and ``flat_rows``: up to how many rows a step computes
    every row in one multiply (the engine's ``decide``, trtspec.speculative.acceptance); without them the head is
    charged once per position decided. On trtspec's CPU kernels a multiply over 5 rows costs 1.28 one row's
    (bfloat16, the example's target): charged per position, a K 4 step that accepted 4 cost 5 heads instead of 1.28."""

    c: float
    body: dict[int, float]
    head: float = 0.0
    target_prefill: float = 0.0
    draft_prefill: float = 0.0
    measured: bool = True  # False: given by the user (--costs), not timed here
    head_rows: dict[int, float] = field(default_factory=dict)
    flat_rows: int = 0

    def step(self, k_eff: int, accepted: int, draft_cost: float | None = None) -> float:
        """One speculative step: ``k_eff`` proposals (each ``draft_cost``, default c), ``accepted`` of them taken."""
        k_eff = max(0, k_eff)
        body = self.body.get(k_eff)
        if body is None:
            raise KeyError(f"no verification cost for K={k_eff}: costs cover K in {sorted(self.body)}")
        return k_eff * (self.c if draft_cost is None else draft_cost) + body + self.head_computed(k_eff, accepted)[1]

    def head_computed(self, k_eff: int, accepted: int) -> tuple[int, float]:
        """(rows, cost) of the head in a step of ``k_eff`` proposals that accepted ``accepted``: every row in one
        multiply up to ``flat_rows``; else the first row, then the later ``k_eff`` rows in one more multiply when the
        first proposal was accepted; without ``head_rows``, one head per position decided."""
        if not self.head_rows:
            return accepted + 1, (accepted + 1) * self.head
        if k_eff + 1 <= self.flat_rows:
            return k_eff + 1, self._rows(k_eff + 1)
        later = k_eff if accepted > 0 else 0
        return 1 + later, self._rows(1) + (self._rows(later) if later else 0.0)

    def _rows(self, n: int) -> float:
        cost = self.head_rows.get(n)
        return n * self.head if cost is None else cost

    def v(self, k: int, tokens_per_step: float) -> float:
        """Verification of K + 1 tokens relative to one target step, as the decoder does it."""
        if self.head_rows and k + 1 <= self.flat_rows:
            return self.body[k] + self._rows(k + 1)
        return self.body[k] + tokens_per_step * self.head

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepCosts:
        """``{"c": 0.1, "v": {"1": 1.1, ...} or 1.2, "head": 0, ...}`` (JSON keys are strings)."""
        v = data.get("v", data.get("body"))
        if isinstance(v, (int, float)):
            body = {k: float(v) for k in range(1, MAX_DRAFT_LEN + 1)}
        elif isinstance(v, dict):
            body = {int(k): float(x) for k, x in v.items()}
        else:
            raise ValueError("costs need 'v': a number or a map K -> verification cost")
        body.setdefault(0, 1.0 - float(data.get("head", 0.0)))
        return cls(
            float(data["c"]),
            body,
            float(data.get("head", 0.0)),
            float(data.get("target_prefill", 0.0)),
            float(data.get("draft_prefill", 0.0)),
            measured=False,
            head_rows={int(k): float(x) for k, x in (data.get("head_rows") or {}).items()},
            flat_rows=int(data.get("flat_rows", 0)),
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["body"] = {str(k): round(v, 4) for k, v in sorted(self.body.items())}
        d["head_rows"] = {str(k): round(v, 4) for k, v in sorted(self.head_rows.items())}
        return d


@dataclass
class MatchProfile:
    """Per reference answer and position: the number of the drafter's proposals that match (<= ``k_max``)."""

    k_max: int
    lengths: list[list[int]]
    max_tokens: list[int]
    draft_cost: list[list[float]] | None = None  # per position, when it differs from c (hybrid: n-gram steps ~0)
    k_limit: list[list[int]] | None = None  # per position, at most this many proposals (hybrid: the model's K)

    def per_position(self) -> list[float]:
        """alpha_j, j = 1..k_max: the chance that proposal j is accepted when proposals 1..j-1 were."""
        out = []
        for j in range(1, self.k_max + 1):
            eligible = accepted = 0
            for row in self.lengths:
                n = len(row)
                for p, L in enumerate(row):
                    if n - p >= j and L >= j - 1:
                        eligible += 1
                        accepted += L >= j
            out.append(accepted / eligible if eligible else 0.0)
        return out

    @property
    def positions(self) -> int:
        return sum(len(r) for r in self.lengths)


@dataclass
class Simulated:
    """A decode of every reference answer at one K, step by step."""

    k: int
    tokens: int
    steps: int
    drafted: int
    accepted: int
    cost: float  # target-step units, decode only
    prefill: float  # target + draft prefill, target-step units
    baseline: float  # target-only: one step per token plus the target's prefill
    a: float = field(init=False)

    def __post_init__(self) -> None:
        rate = self.accepted / self.drafted if self.drafted else 0.0
        self.a = per_token_acceptance(rate * self.k, self.k)

    @property
    def tokens_per_step(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def speedup(self) -> float:
        """Predicted end-to-end speedup over target-only on these requests (prefill included)."""
        return self.baseline / (self.cost + self.prefill) if self.cost else 0.0

    @property
    def decode_speedup(self) -> float:
        return (self.tokens / self.cost) if self.cost else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "a": round(self.a, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "steps": self.steps,
            "predicted_speedup": round(self.speedup, 4),
            "predicted_decode_speedup": round(self.decode_speedup, 4),
        }


def per_token_acceptance(mean_accepted: float, k: int) -> float:
    """The a whose geometric window of K gives ``mean_accepted`` accepted tokens per step (bisection)."""
    if mean_accepted <= 0 or k <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid**i for i in range(1, k + 1)) < mean_accepted else (lo, mid)
    return (lo + hi) / 2


def expected_tokens(a: float, k: int) -> float:
    """(1 - a^(K+1)) / (1 - a): tokens per target step with per-token acceptance a."""
    return float(k + 1) if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)


def leviathan_bound(a: float, k: int, c: float, v: float) -> float:
    """Leviathan et al.'s bound: expected tokens per step over the cost of one step."""
    return expected_tokens(a, k) / (k * c + v)


StepFn = Callable[[int, int, int], tuple[int, int, float]]  # (request, position, cap) -> (k_eff, accepted, cost)


def walk(lengths: Sequence[Sequence[int]], max_tokens: Sequence[int], step: StepFn) -> tuple[int, int, int, float]:
    """(steps, drafted, accepted, cost) of decoding every answer with ``step`` choosing each step's proposals."""
    steps = drafted = accepted = 0
    cost = 0.0
    for r, row in enumerate(lengths):
        p, n = 0, len(row)
        while p < n:
            k_eff, acc, c = step(r, p, max(0, max_tokens[r] - p - 1))
            steps += 1
            drafted += k_eff
            accepted += acc
            cost += c
            p += acc + 1
    return steps, drafted, accepted, cost


def simulate(profile: MatchProfile, k: int, costs: StepCosts) -> Simulated:
    """The decoder at draft length ``k`` on the profile's answers (k = 0: target-only)."""
    if k > profile.k_max:
        raise ValueError(f"K={k} exceeds the profile's k_max {profile.k_max}")

    def step(r: int, p: int, cap: int) -> tuple[int, int, float]:
        k_eff = min(k, cap, profile.k_limit[r][p] if profile.k_limit is not None else k)
        acc = min(profile.lengths[r][p], k_eff)
        dc = profile.draft_cost[r][p] if profile.draft_cost is not None else None
        return k_eff, acc, costs.step(k_eff, acc, dc)

    steps, drafted, accepted, cost = walk(profile.lengths, profile.max_tokens, step)
    tokens = profile.positions
    n_req = len(profile.lengths)
    prefill = n_req * (costs.target_prefill + (costs.draft_prefill if k else 0.0))
    baseline = tokens * costs.step(0, 0) + n_req * costs.target_prefill  # target-only runs the same k = 0 step
    return Simulated(k, tokens, steps, drafted, accepted, cost, prefill, baseline)


def sweep(profile: MatchProfile, costs: StepCosts, ks: Sequence[int]) -> list[Simulated]:
    """``simulate`` for every K in ``ks``."""
    return [simulate(profile, k, costs) for k in ks]


def best_k(results: Sequence[Simulated], measured: dict[int, float] | None = None) -> int:
    """The K with the highest measured speedup where measured, else the highest predicted one."""
    if measured:
        return max(measured, key=lambda k: (measured[k], -k))
    return max(results, key=lambda s: (s.speedup, -s.k)).k


def route_threshold(sim: Simulated, costs: StepCosts, limit: int) -> int:
    """The smallest max_tokens at which speculation beats the target alone for one request (its draft prefill paid
    back by the cheaper tokens); ``limit`` (route everything to the target) when it never does."""
    base = costs.step(0, 0)  # a target-only step
    per_token = sim.cost / sim.tokens if sim.tokens else float("inf")
    if per_token >= base:
        return limit
    return min(limit, max(1, int(costs.draft_prefill / (base - per_token)) + 1))
