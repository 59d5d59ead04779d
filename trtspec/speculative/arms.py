"""What the adaptive policy knows of acceptance (trtspec.speculative.adaptive): the *arms* a proposal can come from
(the n-grams by suffix-match length, the draft model), the acceptance each is expected to have, and how it is
learned from verdicts: per sequence (``SequenceArms``: decayed counts of its recent steps) over a prior shared by
every sequence of the server (``AcceptanceTracker``). Pure Python: the in-flight engine and the BLS orchestrator
share it."""

from __future__ import annotations

from dataclasses import dataclass, field

NGRAM = "ngram"
MODEL = "model"
Arm = tuple[str, int]  # (source, match-length bucket; 0 for the model)

# Per-token acceptance before anything is measured: n-gram proposals by suffix-match length (a longer match is a
# quote or a repeat), the draft model (the example's distilled draft: 0.47 on held-out answers).
DEFAULT_PRIORS: dict[Arm, float] = {
    (NGRAM, 1): 0.3,
    (NGRAM, 2): 0.45,
    (NGRAM, 3): 0.55,
    (NGRAM, 4): 0.65,
    (MODEL, 0): 0.45,
}


def ngram_arm(match_len: int) -> Arm:
    return (NGRAM, max(1, min(4, int(match_len))))


MODEL_ARM: Arm = (MODEL, 0)


def expected_accepted(a: float, k: int, after: float | None = None) -> float:
    """E[accepted proposals] of k proposals whose first is accepted with probability a and each later one, given the
    one before it was, with probability ``after`` (default a): a (1 + after + ... + after^(k-1)); a + a^2 + ... + a^k
    when they are equal."""
    if k <= 0 or a <= 0:
        return 0.0
    b = a if after is None else after
    if b >= 1:
        return a * k
    return a * (1 - b**k) / (1 - b)


@dataclass
class Rate:
    """Decayed counts of accepted proposals (successes) over proposals that had their chance (trials): of a step's
    first proposal, and of the later ones given the one before was accepted (``*_next``). They differ: an n-gram
    whose first token is right is more often inside a quote or a repeat and goes on (measured over the whole server,
    8 workload prompts in a batch, bfloat16: first / later 0.25 / 0.29 at match length 1, 0.31 / 0.38 at 2, 0.43 /
    0.53 at 3, 0.62 / 0.79 at 4), so one rate for every position undervalues a long K against a short one."""

    succ: float = 0.0
    trials: float = 0.0
    succ_next: float = 0.0
    trials_next: float = 0.0

    def add(self, proposed: int, accepted: int) -> None:
        # Proposals are verified left to right: the first rejection ends the step, so a step of k proposals with n
        # accepted gave min(n + 1, k) tokens their chance (the first, and min(n + 1, k) - 1 later ones) and n successes.
        if proposed <= 0:
            return
        self.trials += 1
        self.succ += 1 if accepted > 0 else 0
        self.trials_next += min(accepted + 1, proposed) - 1
        self.succ_next += max(0, accepted - 1)

    def counts(self, later: bool = False) -> tuple[float, float]:
        """(successes, trials) of the first proposal, or of the later ones."""
        return (self.succ_next, self.trials_next) if later else (self.succ, self.trials)

    def decay(self, factor: float) -> None:
        self.succ *= factor
        self.trials *= factor
        self.succ_next *= factor
        self.trials_next *= factor


@dataclass
class AcceptanceTracker:
    """The server-wide prior of every arm: decayed counts over all sequences, started from ``priors``."""

    priors: dict[Arm, float] = field(default_factory=lambda: dict(DEFAULT_PRIORS))
    weight: float = 20.0  # pseudo-trials of the starting prior
    decay: float = 0.998  # per observation of the arm
    rates: dict[Arm, Rate] = field(default_factory=dict)

    def observe(self, arm: Arm, proposed: int, accepted: int) -> None:
        rate = self.rates.setdefault(arm, Rate())
        rate.decay(self.decay)
        rate.add(proposed, accepted)

    def mean(self, arm: Arm, later: bool = False) -> float:
        """The first proposal's acceptance (``later``: a later one's, given the one before it was accepted)."""
        p = self.priors.get(arm, 0.3)
        rate = self.rates.get(arm)
        if rate is None:
            return p
        succ, trials = rate.counts(later)
        return (p * self.weight + succ) / (self.weight + trials)

    def mean_next(self, arm: Arm) -> float:
        return self.mean(arm, later=True)


@dataclass
class SequenceArms:
    """One sequence's evidence per arm (decayed each step), and what it chose."""

    rates: dict[Arm, Rate] = field(default_factory=dict)
    steps: int = 0
    last: tuple[Arm, int] | None = None  # the arm and K of the step being verified
    # A seeded sampled request must give the same text twice: its choices may then depend on nothing but its own
    # history (no measured timings, no other sequence's verdicts, no batch), so they repeat with the seed.
    reproducible: bool = False

    def decay(self, factor: float) -> None:
        for rate in self.rates.values():
            rate.decay(factor)
