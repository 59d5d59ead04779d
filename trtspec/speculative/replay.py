"""The adaptive policy replayed on the target's reference answers, and the least-cost decode any per-step choice could
reach: what adaptive speculation buys on a prompt set, free of the machine's timing noise.

Greedy speculative output is the target's greedy output, so on a reference answer the decoder's steps are fixed by
what each drafter would propose at every answer position and how much of it matches (``MatchProfile``). The adaptive
policy's choices depend only on committed tokens and earlier verdicts (``trtspec.speculative.adaptive``), so they can
be replayed exactly: at each step the policy sees what the engine would show it (the n-gram proposal's length and
match length, whether the draft model can draft and how far its cache lags, the tokens the pass feeds anyway), its
choice is verified on the profile (``min(matched, K)`` accepted) and it learns from the verdict and from the step's
costs (``StepCosts``, in target-step units, reported as the pass costs it would time). With the policy's cost
learning switched off, the replay takes the decoder's steps one for one (tests/test_replay.py checks it against the
real decoder, n-grams only: a draft model's cache can reuse an earlier request's prefix, which the replay does not
model). With it on, the costs are the given ones, exactly: the replay shows what the policy chooses on a machine
whose costs do not drift, where a timed run on a shared 2-core machine scatters by 5-15 % per category.

``least_cost`` is the bound: the cheapest sequence of steps (drafter and K per step) that decodes each answer, found
by dynamic programming over answer positions with the profiles known in advance, which no policy can know. Between
it and the best fixed K lies all that any per-step choice of drafter and K could gain on those answers.

Pure Python (no torch): `trtspec tune` and benchmarks/workloads_cpu.py share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtspec.speculative.adaptive import AdaptivePolicy
from trtspec.speculative.arms import MODEL, NGRAM, SequenceArms
from trtspec.speculative.choice import Ask
from trtspec.speculative.speedup import MatchProfile, Simulated, StepCosts


@dataclass(frozen=True)
class Answers:
    """The reference answers as the drafters see them: the n-gram's profile (its ``k_limit``: the proposal's length
    at each position), its suffix match length per position, the draft model's profile (None: no draft model) and
    each request's prompt length."""

    ngram: MatchProfile
    ngram_match: Sequence[Sequence[int]]
    model: MatchProfile | None
    prompt_lens: Sequence[int]


def _model_step_cost(costs: StepCosts, k: int, accepted: int, lag: int, prompt_len: int) -> float:
    """A draft-model step: K rounds of c, the target's verification, and the draft's catch-up over the tokens its
    cache lacks beyond the one round 0 feeds anyway (priced as its prefill per prompt token)."""
    catch_up = costs.draft_prefill * (lag - 2) / max(1, prompt_len) if lag > 2 else 0.0
    return costs.step(k, accepted) + catch_up


def _limit(profile: MatchProfile, r: int, p: int, cap: int) -> int:
    """At most this many proposals at answer position ``p`` of request ``r`` (its proposal's length, where known)."""
    return min(cap, profile.k_limit[r][p]) if profile.k_limit is not None else cap


def _decoded(answers: Answers, costs: StepCosts, k: int, steps: int, drafted: int, accepted: int, cost: float):
    """The ``Simulated`` of a decode of ``answers`` in ``steps`` steps of ``cost`` (target steps), prefill apart."""
    n_req = len(answers.ngram.lengths)
    prefill = n_req * costs.target_prefill
    baseline = answers.ngram.positions * costs.step(0, 0) + prefill  # target-only: one plain step per token
    return Simulated(k, answers.ngram.positions, steps, drafted, accepted, cost, prefill, baseline)


def replay(policy: AdaptivePolicy, answers: Answers, costs: StepCosts, k_max: int) -> Simulated:
    """The adaptive drafter at max_draft_len ``k_max`` on ``answers``, one request at a time, ``policy`` learning
    across them as a server's does (see the module docstring)."""
    ngram, model = answers.ngram, answers.model
    steps = drafted = accepted = 0
    cost = 0.0
    unit = costs.step(0, 0)  # one target step: what the policy is told a plain pass costs
    for r, row in enumerate(ngram.lengths):
        seq = SequenceArms()
        prompt_len = int(answers.prompt_lens[r])
        cached: int | None = None  # context tokens in the draft model's cache (None: it never drafted for this one)
        p, n = 0, len(row)
        while p < n:
            cap = min(k_max, max(0, ngram.max_tokens[r] - p - 1))
            limit = _limit(ngram, r, p, cap)
            base = prompt_len if p == 0 else 1  # the first step feeds the prompt (prefill) with its proposals
            lag = prompt_len + p - cached if cached is not None else prompt_len + p
            ask = Ask(
                cap,
                [0] * limit,  # a proposal of this length (its tokens are not what the policy reads)
                int(answers.ngram_match[r][p]) if limit else 0,
                model is not None,
                base,
                lag if model is not None else 0,
            )
            (choice,) = policy.plan([seq], [ask])
            k = choice.k if choice.speculates else 0
            if k and choice.source == MODEL and model is not None:
                acc = min(model.lengths[r][p], k)
                step_cost = _model_step_cost(costs, k, acc, lag, prompt_len)
                cached = prompt_len + p + min(acc, k - 1)
                for _ in range(k):
                    policy.observe_draft(1, costs.c)
            elif k and choice.source == NGRAM:
                acc = min(row[p], k)
                step_cost = costs.step(k, acc, 0.0)
            else:
                k, acc = 0, 0
                step_cost = unit
            policy.verdict(seq, k, acc)
            # What the engine times: the pass over the step's tokens (the first one's is the prefill; unknown when
            # the costs have none), and the verification of its rows (the head at each position decided).
            body = costs.body[k] if p else costs.target_prefill + costs.body[k] - costs.body[0]
            if p or costs.target_prefill > 0:
                policy.observe_target(base + k, body)
            if costs.head > 0:  # the head rows the engine computes, and their cost (StepCosts.head_computed)
                policy.observe_verify(*costs.head_computed(k, acc))
            steps += 1
            drafted += k
            accepted += acc
            cost += step_cost
            p += acc + 1
    return _decoded(answers, costs, k_max, steps, drafted, accepted, cost)


def least_cost(answers: Answers, costs: StepCosts, k_max: int) -> Simulated:
    """The cheapest decode of ``answers`` by any choice of drafter (n-grams, the draft model, none) and K <= ``k_max``
    per step, with every match known in advance (see the module docstring; the draft model's catch-up is not
    charged, so this bounds what a policy can reach from below in cost)."""
    ngram, model = answers.ngram, answers.model
    steps = drafted = accepted = 0
    cost = 0.0
    unit = costs.step(0, 0)
    for r, row in enumerate(ngram.lengths):
        n = len(row)
        best = [0.0] * (n + 1)  # best[p]: the least cost of decoding positions p.. of this answer
        move: list[tuple[int, int]] = [(0, 0)] * n  # (k, accepted) of the best step from p
        for p in range(n - 1, -1, -1):
            cap = min(k_max, max(0, ngram.max_tokens[r] - p - 1))
            options = [(unit, 0, 0)]
            for k in range(1, _limit(ngram, r, p, cap) + 1):
                acc = min(row[p], k)
                options.append((costs.step(k, acc, 0.0), k, acc))
            if model is not None:
                for k in range(1, cap + 1):
                    acc = min(model.lengths[r][p], k)
                    options.append((costs.step(k, acc), k, acc))
            c, k, acc = min((c + best[min(n, p + acc + 1)], k, acc) for c, k, acc in options)
            best[p], move[p] = c, (k, acc)
        p = 0
        while p < n:
            k, acc = move[p]
            steps += 1
            drafted += k
            accepted += acc
            p += acc + 1
        cost += best[0]
    return _decoded(answers, costs, k_max, steps, drafted, accepted, cost)
