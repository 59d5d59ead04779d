"""Policies shared by the adaptive speculation tests: a CPU-like priced policy, and a policy that switches drafter
and K on every step's history (exactness must hold for any choice that depends only on the past)."""

from __future__ import annotations

from trtspec.speculative.adaptive import AdaptivePolicy
from trtspec.speculative.arms import MODEL, NGRAM
from trtspec.speculative.choice import Choice
from trtspec.speculative.pass_costs import CostPrior


def cpu_like_policy(verify_c: float = 0.0, verify_row: float = 0.0, **kw) -> AdaptivePolicy:
    """A CPU-like prior: verifying 4 more tokens costs 0.3 of a step, a draft round 0.1; the rows' verification (head,
    acceptance) free unless a test prices it."""
    prior = CostPrior(target_slope=0.075, draft_c=0.1, draft_row=0.02, verify_c=verify_c, verify_row=verify_row)
    return AdaptivePolicy(prior=prior, **kw)


class SwitchingPolicy(AdaptivePolicy):
    """A policy that switches on what happened before (a sequence's step count, how many choices the policy made
    before, and the sequence's last verdict): model, n-grams and no draft in turn, K cycling 1..4, and the n-gram
    whenever the last model step was fully rejected. Exactness must hold for any choice that depends only on the
    past."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.decisions = 0

    def plan(self, seqs, asks, batch_seqs=None):
        out = []
        for seq, ask in zip(seqs, asks):
            self.decisions += 1
            turn = (seq.steps + self.decisions) % 3
            k = min(ask.k_max, 1 + seq.steps % 4)
            if k <= 0 or turn == 2:
                choice = Choice()
            elif (turn == 0 or not ask.ngram_tokens) and ask.model and getattr(seq, "_ok", True):
                choice = Choice(MODEL, k, (MODEL, 0))
            elif ask.ngram_tokens:
                choice = Choice(NGRAM, min(k, len(ask.ngram_tokens)), (NGRAM, 1))
            else:
                choice = Choice()
            seq.last = (choice.arm, choice.k) if choice.speculates else None
            self.steps[choice.source or "none"] += 1
            out.append(choice)
        return out

    def verdict(self, seq, proposed, accepted):
        seq._ok = not (seq.last is not None and seq.last[0][0] == MODEL and proposed and accepted == 0)
        super().verdict(seq, proposed, accepted)
