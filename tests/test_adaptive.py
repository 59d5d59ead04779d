"""Adaptive speculation's policy (trtspec.speculative.adaptive and choice): its choices of drafter and K from
acceptance and costs, alone and in a batch. The cost curves are in test_pass_costs.py; the drafters that carry the
choices into the engine and the BLS orchestrator, and exactness whatever they choose, in test_adaptive_drafters.py
(the sampled distribution by chi-square in test_sampling_distribution.py)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.adaptive_helpers import cpu_like_policy
from trtspec.speculative.adaptive import AdaptivePolicy
from trtspec.speculative.arms import MODEL, NGRAM, SequenceArms, expected_accepted
from trtspec.speculative.choice import Ask, Choice


def test_expected_accepted_is_the_geometric_sum():
    assert expected_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_accepted(0.3, 3, 0.9) == pytest.approx(0.3 * (1 + 0.9 + 0.81))
    assert expected_accepted(0.3, 3, 1.0) == pytest.approx(0.9)
    assert expected_accepted(1.0, 4) == 4 and expected_accepted(0.0, 4) == 0 and expected_accepted(0.7, 0) == 0


def test_a_long_ngram_match_is_taken_at_full_length_at_concurrency_one():
    policy = cpu_like_policy()
    (choice,) = policy.plan([SequenceArms()], [Ask(4, [1, 2, 3, 4], ngram_match=4)])
    assert choice == Choice(NGRAM, 4, (NGRAM, 4))


def test_without_an_ngram_match_the_draft_model_drafts_when_it_is_accepted_often():
    policy = cpu_like_policy(priors={(MODEL, 0): 0.8})
    (choice,) = policy.plan([SequenceArms()], [Ask(4, [], model=True)])
    assert choice.source == MODEL and choice.k >= 3
    # ... and not when it is rarely accepted: K 0, a plain target step
    policy = cpu_like_policy(priors={(MODEL, 0): 0.05})
    (choice,) = policy.plan([SequenceArms()], [Ask(4, [], model=True)])
    assert not choice.speculates


def test_the_draft_model_s_catch_up_is_charged_to_its_option():
    """A draft that has never drafted for a long sequence must take it all in first: that pass is charged, so the
    model that pays once caught up (a token or two behind) does not pay for a 400-token catch-up."""
    policy = cpu_like_policy(priors={(MODEL, 0): 0.6})
    caught_up = policy.plan([SequenceArms()], [Ask(4, [], model=True, model_lag=1)])[0]
    assert caught_up.source == MODEL
    behind = policy.plan([SequenceArms()], [Ask(4, [], model=True, model_lag=400)])[0]
    assert not behind.speculates


def test_speculation_backs_off_at_high_concurrency():
    """The same sequence that speculates alone does not when 32 sequences share the step: the step's cost is then
    spread over 32 tokens, and a 0.45-acceptance proposal no longer beats the rate."""
    policy = cpu_like_policy()
    ask = Ask(4, [5, 6, 7, 8], ngram_match=2)
    assert policy.plan([SequenceArms()], [ask])[0].speculates
    many = policy.plan([SequenceArms() for _ in range(32)], [ask] * 32)
    assert not any(c.speculates for c in many)
    # a quote (long match, high acceptance) still pays there
    policy.tracker.priors[(NGRAM, 4)] = 0.95
    quoted = policy.plan([SequenceArms() for _ in range(32)], [Ask(4, [5, 6, 7, 8], ngram_match=4)] * 32)
    assert all(c.speculates for c in quoted)


def test_a_sequence_whose_proposals_fail_switches_off_and_comes_back():
    policy = cpu_like_policy()
    seq = SequenceArms()
    ask = Ask(4, [], model=True)
    assert policy.plan([seq], [ask])[0].source == MODEL
    for _ in range(30):  # every proposal rejected
        choice = policy.plan([seq], [ask])[0]
        policy.verdict(seq, choice.k, 0)
    assert not policy.plan([seq], [ask])[0].speculates
    policy.verdict(seq, 0, 0)
    # Its own evidence fades step by step while it does not speculate; the server-wide prior, taught by this
    # sequence's failures too, still says the model is poor, yet the exploration bonus brings it back eventually.
    came_back = None
    for step in range(200):
        choice = policy.plan([seq], [ask])[0]
        if choice.speculates:
            came_back = step
            break
        policy.verdict(seq, 0, 0)
    assert came_back is not None and came_back > 3, came_back
    # A long n-gram match (its text became predictable: a quote) speculates at once.
    off = SequenceArms()
    for _ in range(30):
        policy.plan([off], [ask])
        policy.verdict(off, 4, 0)
    assert policy.plan([off], [Ask(4, [1, 2, 3, 4], ngram_match=4)])[0].source == NGRAM


def test_alone_the_choice_is_the_k_of_the_highest_rate_not_of_the_highest_net_gain():
    """This CPU's measured passes (1, 2, 3, 5 tokens: 59, 63, 82, 84 ms) and a 0.5-acceptance n-gram: K 4 gains the
    most tokens over the plain step's rate, K 1 gives the most tokens per second ((1 + E) / T); the policy takes the
    latter, and over many acceptances and cost curves it always takes the brute-force best ratio."""
    import random

    def measured(costs: dict[int, float]) -> AdaptivePolicy:
        policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 2): 0.5})
        for n, t in costs.items():
            policy.observe_target(n, t)
        return policy

    cpu = {1: 0.059, 2: 0.063, 3: 0.082, 4: 0.083, 5: 0.084}
    policy = measured(cpu)
    (choice,) = policy.plan([SequenceArms()], [Ask(4, [5, 6, 7, 8], ngram_match=2)])
    seq = SequenceArms()
    a = policy.acceptance(seq, (NGRAM, 2))
    rates = {k: (1 + expected_accepted(a, k)) / cpu[1 + k] for k in range(5)}
    assert choice.k == max(rates, key=rates.__getitem__) == 1, rates
    rng = random.Random(0)
    for _ in range(200):
        steps = sorted(rng.uniform(0.05, 0.1) for _ in range(5))
        costs = {n: t for n, t in zip(range(1, 6), steps)}
        policy = measured(costs)
        policy.tracker.priors[(NGRAM, 2)] = rng.uniform(0.05, 0.95)
        a = policy.acceptance(SequenceArms(), (NGRAM, 2))
        (choice,) = policy.plan([SequenceArms()], [Ask(4, [5, 6, 7, 8], ngram_match=2)])
        rates = {k: (1 + expected_accepted(a, k)) / costs[1 + k] for k in range(5)}
        assert rates[choice.k] == pytest.approx(max(rates.values())), (choice, rates)


def test_at_concurrency_eight_speculation_pays_where_the_measured_pass_grows_little():
    """The bfloat16 step measured at 8 sequences (8 tokens: 100 ms, 16: 112, 24: 134, 40: 130): adding a 0.45-
    acceptance 4-token proposal to a sequence costs little next to the pass every sequence shares, so every sequence
    speculates, and the expected tokens per second of the step beat the plain step's."""
    policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 2): 0.45})
    for n, t in {8: 0.100, 16: 0.112, 24: 0.134, 40: 0.130}.items():
        policy.observe_target(n, t, seqs=8)
    asks = [Ask(4, [5, 6, 7, 8], ngram_match=2)] * 8
    choices = policy.plan([SequenceArms() for _ in asks], asks)
    assert all(c.speculates for c in choices), choices
    fed = 8 + sum(c.k for c in choices)
    gain = sum(expected_accepted(0.45, c.k) for c in choices)
    assert (8 + gain) / policy.target.cost(fed) > 8 / 0.100


def test_in_a_batch_speculation_must_beat_the_plain_step_by_the_margin():
    """8 sequences, one with a weak n-gram proposal whose best option raises the step's expected rate by under 3 %:
    within the estimates' error there, so the step stays plain (and the engine drafter may skip its work); without
    the margin it speculates. Alone, the margin does not apply."""
    asks = [Ask(4, [5, 6, 7, 8], ngram_match=1)] + [Ask(4)] * 7
    choices = {}
    for margin in (0.03, 0.0):
        policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 1): 0.3}, batch_margin=margin)
        for n, t in {8: 0.100, 9: 0.101, 12: 0.104}.items():
            policy.observe_target(n, t, seqs=8)
        choices[margin] = policy.plan([SequenceArms() for _ in asks], asks)
    assert not any(c.speculates for c in choices[0.03]), choices[0.03]
    assert choices[0.0][0].speculates, choices[0.0]
    alone = cpu_like_policy(explore=0.0, priors={(NGRAM, 1): 0.3}, batch_margin=0.5)
    assert alone.plan([SequenceArms()], [asks[0]])[0].speculates


def test_a_step_that_prefills_a_prompt_prices_speculation_at_the_decode_step_s_rate():
    """8 sequences on a compute-bound pass (every token 12.5 ms, as at batch 8 on this CPU): a 0.3-acceptance draft
    token costs as much as a plain one and never pays in a decode step. In a step where one sequence also feeds a
    64-token prompt the step's own rate is 9 tokens/s against the decode step's 80, and priced against it the same
    draft looked worth taking; the prefill is paid whatever the choice, so the choice is the decode step's. Where a
    draft token is cheap (a memory-bound pass) it pays in both."""
    asks = [Ask(4, [5, 6, 7, 8], ngram_match=2)] * 8
    prefill = [Ask(4, [], base_tokens=64)] + asks[1:]
    for per_token, fixed, pays in ((0.0125, 0.0, False), (0.0005, 0.1, True)):
        policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 2): 0.3})
        for n in (8, 9, 10, 12, 16, 40, 71, 72, 75, 80, 110):
            policy.observe_target(n, fixed + per_token * n, seqs=8)
        decode = policy.plan([SequenceArms() for _ in asks], asks)
        with_prompt = policy.plan([SequenceArms() for _ in prefill], prefill)
        assert any(c.speculates for c in decode) is pays, decode
        assert any(c.speculates for c in with_prompt) is pays, with_prompt


def test_in_a_batch_a_sequence_s_estimate_carries_no_exploration_bonus():
    """Alone, an arm a sequence has no evidence of is estimated above its prior (the exploration bonus); in a batch
    an exploring draft would cost every sequence of the pass, so there the estimate is the prior. A seeded sequence
    keeps the bonus in both (its choices must not depend on the batch)."""
    policy = cpu_like_policy()
    arm = (NGRAM, 2)
    ask = Ask(4, [5, 6, 7, 8], ngram_match=2)
    fresh, seeded = SequenceArms(), SequenceArms(reproducible=True)
    policy.plan([fresh], [ask])
    alone = policy.acceptance(fresh, arm)
    seeded_alone = policy.acceptance(seeded, arm)
    policy.plan([SequenceArms() for _ in range(8)], [ask] * 8)
    assert alone == pytest.approx(policy.acceptance(fresh, arm) + policy.explore)
    assert policy.acceptance(seeded, arm) == pytest.approx(seeded_alone)


def test_a_batch_s_plain_pass_is_timed_before_speculation_is_priced_against_it():
    """8 sequences whose passes were all speculative (16-24 tokens, 70-74 ms): the plain 8-token pass is not
    measured, and estimated from those it would look as dear as they are, making speculation look free. The policy
    takes one plain step (K 0 for all), which times it, and then prices speculation against the real plain cost."""
    policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 2): 0.3})
    for n, t in {16: 0.071, 20: 0.071, 24: 0.074}.items():
        policy.observe_target(n, t, seqs=8)
    asks = [Ask(4, [5, 6, 7, 8], ngram_match=2)] * 8
    assert not policy.target.measured(8, seqs=8)
    assert not any(c.speculates for c in policy.plan([SequenceArms() for _ in asks], asks))
    policy.observe_target(8, 0.050, seqs=8)  # the plain step, timed: 16 tokens cost 1.4x it
    assert policy.target.measured(8, seqs=8)
    assert not any(c.speculates for c in policy.plan([SequenceArms() for _ in asks], asks))
    cheap = cpu_like_policy(explore=0.0, priors={(NGRAM, 2): 0.3})
    for n, t in {8: 0.068, 16: 0.071, 20: 0.071, 24: 0.074}.items():  # ... or 1.04x it: then it pays
        cheap.observe_target(n, t, seqs=8)
    assert any(c.speculates for c in cheap.plan([SequenceArms() for _ in asks], asks))
    # a single sequence, and a policy that has timed nothing yet, are not held back
    assert cpu_like_policy(explore=0.0).target.measured(1) and cpu_like_policy(explore=0.0).target.measured(8, seqs=8)


def test_a_batch_s_plain_pass_is_timed_again_when_its_curve_has_not_seen_one_for_long():
    """8 sequences speculating on every step: the plain 8-token pass was timed once, long ago, and its estimate keeps
    the machine's speed of then. After ``retime_plain`` passes without one the policy takes one plain step, which
    times it again; then it speculates."""
    policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 2): 0.6}, retime_plain=16)
    policy.observe_target(8, 0.050, seqs=8)
    asks = [Ask(4, [5, 6, 7, 8], ngram_match=2)] * 8
    assert any(c.speculates for c in policy.plan([SequenceArms() for _ in asks], asks))
    for _ in range(16):
        policy.observe_target(24, 0.060, seqs=8)
    assert not policy.target.measured(8, seqs=8, within=16) and policy.target.measured(8, seqs=8)
    assert not any(c.speculates for c in policy.plan([SequenceArms() for _ in asks], asks))
    policy.observe_target(8, 0.050, seqs=8)
    assert any(c.speculates for c in policy.plan([SequenceArms() for _ in asks], asks))


def test_a_size_priced_high_in_a_slow_stretch_is_timed_again_alone_and_then_counts():
    """One sequence: the 5-token pass (K 4) was timed only during a slow stretch, 35 % over the 4-token pass, so the
    policy takes K 3 and never times it again. Once that size has gone unmeasured for STALE_PASSES passes, a step
    that could take K 4 takes it, once; that pass weighs as much as the old ones, and the price falls."""
    from trtspec.speculative.pass_costs import STALE_PASSES

    policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 3): 0.5})
    ask = Ask(4, [5, 6, 7, 8], ngram_match=3)
    for _ in range(8):
        for n in (1, 2, 3, 4):
            policy.observe_target(n, 0.010 + 0.0001 * n)
        policy.observe_target(5, 0.0141)  # the slow stretch
    (first,) = policy.plan([SequenceArms()], [ask])
    assert first.k == 3, first
    for i in range(STALE_PASSES):
        (c,) = policy.plan([SequenceArms()], [ask])
        assert c.k == 3, (i, c)  # not stale yet: the policy's own choice
        policy.observe_target(4, 0.0104)
    (retimed,) = policy.plan([SequenceArms()], [ask])
    assert retimed.k == 4, retimed
    # never for a batch, nor for a prompt's step, nor for a seeded sequence (whose choices depend on its history)
    assert all(c.k < 4 for c in policy.plan([SequenceArms(), SequenceArms()], [ask, ask]))
    (prefill,) = policy.plan([SequenceArms()], [dataclasses.replace(ask, base_tokens=40)])
    assert prefill.k < 4
    before = policy.target.cost(5)
    policy.observe_target(5, 0.0106)
    assert policy.target.cost(5) < before - 0.5 * (before - 0.0106) * 0.99  # half the way, not 1/9 of it


def test_a_size_that_is_dear_in_fact_is_re_timed_less_and_less_often():
    """One sequence with K up to 8 on this CPU's shape of costs: passes of 1-6 tokens cost about one step, 7-9 tokens
    1.5-2x (the multiply past its memory-bound rows). The policy takes K 8 to re-time the 9-token pass when it has
    gone unmeasured for STALE_PASSES passes; each re-timing finds it at its price, so the next comes twice as late:
    over 2,000 steps a handful of re-timings, not one every 65 steps (measured: 27 of 895 steps)."""
    from trtspec.speculative.pass_costs import STALE_PASSES

    seconds = {1: 0.0100, 2: 0.0102, 3: 0.0104, 4: 0.0106, 5: 0.0108, 6: 0.0120, 7: 0.0150, 8: 0.0180, 9: 0.0200}
    policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 3): 0.5})
    ask = Ask(8, list(range(5, 13)), ngram_match=3)
    for n, t in seconds.items():
        policy.observe_target(n, t)
    chosen = []
    for _ in range(2000):
        (c,) = policy.plan([SequenceArms()], [ask])
        chosen.append(c.k)
        policy.observe_target(1 + c.k, seconds[1 + c.k])
    retimed = [i for i, k in enumerate(chosen) if k == 8]
    assert max(set(chosen), key=chosen.count) < 6  # the policy's own choice stays below the dear sizes
    assert 3 <= len(retimed) <= 6, retimed
    gaps = [b - a for a, b in zip(retimed, retimed[1:])]
    assert gaps == sorted(gaps) and gaps[0] >= STALE_PASSES, gaps


def test_target_costs_are_learned_per_number_of_sequences():
    """8 tokens of 8 sequences cost more than 8 tokens of 2 (each sequence attends on its own), and the slope of a
    full batch is its own: the policy prices a batch's draft tokens on the curve of that batch size (or of the
    nearest one measured)."""
    policy = cpu_like_policy(explore=0.0)
    for n, t in {1: 0.046, 5: 0.052, 8: 0.060}.items():
        policy.observe_target(n, t, seqs=1)
    for n, t in {8: 0.100, 40: 0.130}.items():
        policy.observe_target(n, t, seqs=8)
    assert policy.target.cost(8, seqs=8) == pytest.approx(0.100)
    assert policy.target.cost(8, seqs=1) == pytest.approx(0.060)
    assert policy.target.cost(24, seqs=7) == pytest.approx(0.115)  # 7 unmeasured: the nearest, 8
    assert set(policy.snapshot()["target_pass_s"]) == {1, 8}


def test_a_step_in_the_pass_cost_is_paid_by_the_whole_batch_together():
    """Measured in a batch of 8 (bfloat16): 8 tokens 63 ms, 9 tokens 90, then 1 ms per token up to 40. One
    sequence's draft never pays for the step up, so sequence by sequence none would speculate; all of them together
    do (2.3 tokens each for 1.9x the time). The policy takes the choice of the higher expected rate."""
    policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 2): 0.6})
    curve = {8: 0.063, 9: 0.090, 16: 0.097, 24: 0.105, 40: 0.121}
    for n, t in curve.items():
        policy.observe_target(n, t, seqs=8)
    asks = [Ask(4, [5, 6, 7, 8], ngram_match=2)] * 8
    seqs = [SequenceArms() for _ in asks]
    choices = policy.plan(seqs, asks)
    assert all(c.speculates for c in choices), choices
    fed = 8 + sum(c.k for c in choices)
    gain = sum(expected_accepted(0.6, c.k) for c in choices)
    assert (8 + gain) / policy.target.cost(fed, seqs=8) > 1.1 * 8 / 0.063
    # with a poor proposal the step is not worth it, for anyone
    poor = cpu_like_policy(explore=0.0, priors={(NGRAM, 2): 0.1})
    for n, t in curve.items():
        poor.observe_target(n, t, seqs=8)
    assert not any(c.speculates for c in poor.plan([SequenceArms() for _ in asks], asks))


def test_acceptance_is_learned_for_the_first_proposal_and_for_the_ones_after_it():
    """An n-gram whose first token is right is usually in a quote and goes on: first proposals accepted 30 % of the
    time, the later ones 90 % given the one before. Learned apart, the expected gain of K 4 is 3.4x that of K 1 and
    the policy takes the K of the best rate on the true acceptances (4); one rate pooled over every position (0.57
    here) would take K 3."""
    import random

    rng = random.Random(1)
    policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 2): 0.5})
    for n, t in {1: 0.050, 2: 0.055, 3: 0.060, 4: 0.065, 5: 0.070}.items():
        policy.observe_target(n, t)
    seq = SequenceArms()
    ask = Ask(4, [5, 6, 7, 8], ngram_match=2)
    for _ in range(400):
        (choice,) = policy.plan([seq], [ask])
        if not choice.speculates:
            policy.verdict(seq, 0, 0)
            continue
        accepted = 0
        while accepted < choice.k and rng.random() < (0.3 if accepted == 0 else 0.9):
            accepted += 1
        policy.verdict(seq, choice.k, accepted)
    assert policy.acceptance(seq, (NGRAM, 2)) == pytest.approx(0.3, abs=0.08)
    assert policy.continuation(seq, (NGRAM, 2)) == pytest.approx(0.9, abs=0.08)
    (choice,) = policy.plan([seq], [ask])
    cost = {k: 0.050 + 0.005 * k for k in range(5)}
    true = {k: (1 + expected_accepted(0.3, k, 0.9)) / cost[k] for k in range(5)}
    pooled = {k: (1 + expected_accepted(0.57, k)) / cost[k] for k in range(5)}
    assert choice.k == max(true, key=true.__getitem__) == 4, true
    assert max(pooled, key=pooled.__getitem__) == 3


def test_verifying_rows_is_charged_for_the_head_rows_it_computes():
    """Verification costs per head row computed (the head, the acceptance routine): a step's later rows are computed
    when its first proposal is accepted, so an option pays for them with that probability. A row dearer than a plain
    step makes speculation lose; a dear row still cheaper than one does not, alone (an accepted token needs its head
    row in a plain step too); in a batch dear rows shorten K."""
    ask = Ask(4, [5, 6, 7, 8], ngram_match=2)
    assert cpu_like_policy().plan([SequenceArms()], [ask])[0].speculates
    assert cpu_like_policy(verify_c=0.05, verify_row=0.6).plan([SequenceArms()], [ask])[0].speculates
    dear = cpu_like_policy(verify_c=0.05, verify_row=1.2)  # a head row costs more than a whole plain step
    assert not dear.plan([SequenceArms()], [ask])[0].speculates
    dear.observe_verify(1, 0.002)  # measured: cheap after all
    dear.observe_verify(5, 0.0025)
    dear.observe_target(1, 0.05)
    assert dear.plan([SequenceArms()], [ask])[0].speculates
    pair = [SequenceArms(), SequenceArms()]
    cheap_k = [c.k for c in cpu_like_policy(explore=0.0).plan(pair, [ask, ask])]
    dear_rows = cpu_like_policy(explore=0.0, verify_row=0.3)
    dear_k = [c.k for c in dear_rows.plan([SequenceArms(), SequenceArms()], [ask, ask])]
    assert sum(dear_k) < sum(cheap_k), (dear_k, cheap_k)


def test_the_policy_counts_what_it_chose():
    policy = cpu_like_policy(priors={(NGRAM, 4): 0.9})  # a quote: it pays in a batch of two
    policy.plan([SequenceArms(), SequenceArms()], [Ask(4, [1, 2, 3, 4], ngram_match=4), Ask(0)])
    snap = policy.snapshot()
    assert snap["steps"] == {NGRAM: 1, MODEL: 0, "none": 1}
    assert snap["no_speculation_share"] == 0.5 and snap["k_chosen"] == {0: 1, 4: 1}
