"""Adaptive speculation (trtspec.speculative.adaptive, its arms and the adaptive drafter): the policy's choices from
acceptance and costs, and exactness through the decoder whatever it chooses (greedy identity batched and not; the
sampled distribution by chi-square in test_sampling_distribution.py)."""

from __future__ import annotations

import dataclasses
import types

import pytest

from trtspec.speculative.adaptive import AdaptivePolicy
from trtspec.speculative.arms import MODEL, NGRAM, SequenceArms, expected_accepted
from trtspec.speculative.choice import Ask, Choice
from trtspec.speculative.pass_costs import CostPrior, PassCosts, isotonic


def _policy(verify_c: float = 0.0, verify_row: float = 0.0, **kw) -> AdaptivePolicy:
    # A CPU-like prior: verifying 4 more tokens costs 0.3 of a step, a draft round 0.1; the rows' verification (head,
    # acceptance) free unless a test prices it.
    prior = CostPrior(target_slope=0.075, draft_c=0.1, draft_row=0.02, verify_c=verify_c, verify_row=verify_row)
    return AdaptivePolicy(prior=prior, **kw)


def test_expected_accepted_is_the_geometric_sum():
    assert expected_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_accepted(0.3, 3, 0.9) == pytest.approx(0.3 * (1 + 0.9 + 0.81))
    assert expected_accepted(0.3, 3, 1.0) == pytest.approx(0.9)
    assert expected_accepted(1.0, 4) == 4 and expected_accepted(0.0, 4) == 0 and expected_accepted(0.7, 0) == 0


def test_a_long_ngram_match_is_taken_at_full_length_at_concurrency_one():
    policy = _policy()
    (choice,) = policy.plan([SequenceArms()], [Ask(4, [1, 2, 3, 4], ngram_match=4)])
    assert choice == Choice(NGRAM, 4, (NGRAM, 4))


def test_without_an_ngram_match_the_draft_model_drafts_when_it_is_accepted_often():
    policy = _policy(priors={(MODEL, 0): 0.8})
    (choice,) = policy.plan([SequenceArms()], [Ask(4, [], model=True)])
    assert choice.source == MODEL and choice.k >= 3
    # ... and not when it is rarely accepted: K 0, a plain target step
    policy = _policy(priors={(MODEL, 0): 0.05})
    (choice,) = policy.plan([SequenceArms()], [Ask(4, [], model=True)])
    assert not choice.speculates


def test_the_draft_model_s_catch_up_is_charged_to_its_option():
    """A draft that has never drafted for a long sequence must take it all in first: that pass is charged, so the
    model that pays once caught up (a token or two behind) does not pay for a 400-token catch-up."""
    policy = _policy(priors={(MODEL, 0): 0.6})
    caught_up = policy.plan([SequenceArms()], [Ask(4, [], model=True, model_lag=1)])[0]
    assert caught_up.source == MODEL
    behind = policy.plan([SequenceArms()], [Ask(4, [], model=True, model_lag=400)])[0]
    assert not behind.speculates


def test_speculation_backs_off_at_high_concurrency():
    """The same sequence that speculates alone does not when 32 sequences share the step: the step's cost is then
    spread over 32 tokens, and a 0.45-acceptance proposal no longer beats the rate."""
    policy = _policy()
    ask = Ask(4, [5, 6, 7, 8], ngram_match=2)
    assert policy.plan([SequenceArms()], [ask])[0].speculates
    many = policy.plan([SequenceArms() for _ in range(32)], [ask] * 32)
    assert not any(c.speculates for c in many)
    # a quote (long match, high acceptance) still pays there
    policy.tracker.priors[(NGRAM, 4)] = 0.95
    quoted = policy.plan([SequenceArms() for _ in range(32)], [Ask(4, [5, 6, 7, 8], ngram_match=4)] * 32)
    assert all(c.speculates for c in quoted)


def test_a_sequence_whose_proposals_fail_switches_off_and_comes_back():
    policy = _policy()
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
        policy = _policy(explore=0.0, priors={(NGRAM, 2): 0.5})
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


def test_pass_costs_follow_the_prior_until_measured_then_the_measurements():
    costs = PassCosts(CostPrior(target_slope=0.1).target)
    assert costs.cost(5) == pytest.approx(1.4)  # relative units before any measurement
    costs.observe(1, 0.05)
    assert costs.cost(1) == pytest.approx(0.05)
    assert costs.cost(5) == pytest.approx(0.05 * 1.4)  # the prior's shape, scaled to seconds
    costs.observe(5, 0.1)
    assert costs.cost(5) == pytest.approx(0.1)


def test_measured_pass_costs_are_used_as_their_non_decreasing_fit():
    """A memory-bound step's passes of 1-5 tokens cost about the same; their measured averages then rank them at
    random (a run of the bfloat16 path: 55, 75, 56, 77, 51 ms). The policy uses their isotonic fit: with a
    0.64-acceptance long n-gram match and these averages it takes K 4, where the raw averages (3 tokens 'cheaper'
    than 2 and than 5) would take K 2."""
    costs = PassCosts(CostPrior().target)
    for n, t in {1: 0.055, 2: 0.075, 3: 0.056, 4: 0.077, 5: 0.051}.items():
        costs.observe(n, t)
    fitted = [costs.cost(n) for n in range(1, 6)]
    assert fitted == sorted(fitted) and fitted[0] == pytest.approx(0.055)
    assert fitted[1:] == pytest.approx([(0.075 + 0.056 + 0.077 + 0.051) / 4] * 4)  # pooled adjacent violators
    assert isotonic({1: 1.0, 2: 2.0, 3: 3.0}) == {1: 1.0, 2: 2.0, 3: 3.0}  # a monotone curve is kept as it is
    # weighted: one pass at size 2 does not pull nine at size 3 up to it
    assert isotonic({1: 1.0, 2: 5.0, 3: 2.0}, {1: 9, 2: 1, 3: 9}) == pytest.approx({1: 1.0, 2: 2.3, 3: 2.3})
    costs = PassCosts(CostPrior().target)
    for _ in range(9):
        costs.observe(1, 0.029)
        costs.observe(5, 0.034)
    costs.observe(3, 0.051)
    assert costs.cost(5) == pytest.approx((0.051 + 9 * 0.034) / 10)
    raw = {1: 0.055, 2: 0.075, 3: 0.056, 4: 0.077, 5: 0.070}
    policy = _policy(explore=0.0, priors={(NGRAM, 4): 0.64})
    for n, t in raw.items():
        policy.observe_target(n, t)
    (choice,) = policy.plan([SequenceArms()], [Ask(4, [5, 6, 7, 8], ngram_match=4)])
    assert choice.k == 4, choice
    a = policy.acceptance(SequenceArms(), (NGRAM, 4))
    on_raw = {k: (1 + expected_accepted(a, k)) / raw[1 + k] for k in range(5)}
    assert max(on_raw, key=on_raw.__getitem__) == 2, on_raw  # what the raw averages would have chosen


def test_the_live_fit_kept_up_pass_by_pass_is_the_full_fit():
    """A pass that leaves the shapes in order moves only its own size's fit (the full fit is not redone every
    pass); whatever the order of passes, the fit must be the full weighted isotonic fit of the shapes."""
    import math
    import random

    rng = random.Random(3)
    costs = PassCosts(CostPrior().target)
    shortcuts = 0
    for i in range(3000):
        n = rng.choice([1, 2, 3, 4, 5, 5, 5, 8, 24, 96])
        slow = 1.4 if (i // 200) % 3 == 2 else 1.0  # the machine's speed moves in stretches
        costs.observe(n, 0.01 * (1 + 0.06 * n) * slow * rng.uniform(0.8, 1.25))
        full = isotonic(
            {b: math.exp(v) for b, v in costs._log_shape.items()},
            {b: float(min(64, k)) for b, k in costs._passes.items()},
        )
        assert costs._fit == pytest.approx(full, rel=1e-12)
        shortcuts += costs._ordered
    assert 0 < shortcuts < 3000  # both ways were taken


def test_live_costs_take_a_slowdown_every_size_sees_as_the_machine_s():
    """A live curve is drift x shape: a change that passes of every size see moves the drift, shared by all sizes, and
    a size's shape moves slowly. On a 2-vCPU VM the same 1-token pass read 38 and 56 ms in adjacent prompts. With
    one median per size (the old curve), a slow stretch in which the policy takes 5 tokens a step left the 1-token
    price at the fast machine's (a 5-token pass then cost 1.72 plain steps, not 1.15) and a size chosen only during
    the stretch (3 tokens) kept its seconds for good, pooled by the non-decreasing fit with 4 and 5 (55 ms where
    46 ms is measured)."""
    costs = PassCosts(CostPrior().target)
    for _ in range(30):
        costs.observe(1, 0.040)
        costs.observe(5, 0.046)
    assert [costs.cost(n) for n in (1, 3, 5)] == pytest.approx([0.040, 0.043, 0.046])  # interpolated at 3
    for i in range(60):  # a slow stretch: everything 1.5x; in its second half the 3-token passes are chosen too
        costs.observe(5, 0.046 * 1.5)
        if i >= 30:
            costs.observe(3, 0.043 * 1.5)
    assert costs.cost(1) > 0.040 * 1.3 and costs.cost(5) / costs.cost(1) < 1.3
    for _ in range(40):  # back to normal, 5 tokens a step
        costs.observe(5, 0.046)
    assert costs.cost(5) == pytest.approx(0.046, rel=0.02)
    assert costs.cost(1) == pytest.approx(0.040, rel=0.03)
    assert costs.cost(3) < 0.048


def test_batch_sizes_share_the_machine_s_drift():
    """Every batch size's live curve has its own shape and one shared drift: passes of 8 sequences that run 1.4x
    slower also raise the price of a one-sequence pass, not served meanwhile."""
    from trtspec.speculative.pass_costs import BatchPassCosts

    costs = BatchPassCosts(CostPrior().target)
    for _ in range(30):
        costs.observe(1, 0.040, seqs=1)
        costs.observe(5, 0.046, seqs=1)
        costs.observe(8, 0.080, seqs=8)
        costs.observe(40, 0.130, seqs=8)
    assert costs.cost(1, 1) == pytest.approx(0.040, rel=0.01) and costs.cost(40, 8) == pytest.approx(0.130, rel=0.01)
    for _ in range(40):  # only batches of 8 now, on a slower machine
        costs.observe(8, 0.080 * 1.4, seqs=8)
        costs.observe(40, 0.130 * 1.4, seqs=8)
    assert costs.cost(8, 8) == pytest.approx(0.080 * 1.4, rel=0.03)
    assert costs.cost(1, 1) > 0.040 * 1.3  # most of the slowdown (the 8-sequence shapes move a little too)
    assert costs.cost(5, 1) / costs.cost(1, 1) == pytest.approx(0.046 / 0.040, rel=0.01)  # its shape kept


def test_pass_costs_between_measured_sizes_are_interpolated():
    """A batch of 8 feeds 8-40 tokens a step. Sizes between measured ones are priced on the line between them (once
    they were priced as the next bucket up: 17 tokens as 24), a size is recorded at its nearest bucket, and outside
    the measured sizes the prior's shape is anchored at the nearest one."""
    costs = PassCosts(CostPrior(target_slope=0.1).target)
    for n, t in {8: 0.100, 16: 0.112, 24: 0.134}.items():
        costs.observe(n, t)
    assert costs.cost(12) == pytest.approx(0.106)
    assert costs.cost(17) == pytest.approx(0.112 + 0.022 / 8)
    assert costs.cost(4) == pytest.approx(0.100 * 1.3 / 1.7)  # below: the prior's shape from 8
    # above: from 24 on the measured slope (the last segment's 0.022 / 8, steeper than the range's 0.034 / 16), not
    # the prior's (which priced a pass beyond the sizes timed as if every token cost a one-token pass's slope: at 8
    # sequences on a memory-bound step about half the requests speculated where all should)
    assert costs.cost(32) == pytest.approx(0.134 + 8 * 0.022 / 8)
    assert costs.cost(32) < 0.134 * 4.1 / 3.3
    costs.observe(41, 0.150)  # nearest bucket: 40
    assert costs.seconds[40] == pytest.approx(0.150) and costs.cost(36) == pytest.approx(0.134 + 0.016 * 12 / 16)


def test_at_concurrency_eight_speculation_pays_where_the_measured_pass_grows_little():
    """The bfloat16 step measured at 8 sequences (8 tokens: 100 ms, 16: 112, 24: 134, 40: 130): adding a 0.45-
    acceptance 4-token proposal to a sequence costs little next to the pass every sequence shares, so every sequence
    speculates, and the expected tokens per second of the step beat the plain step's."""
    policy = _policy(explore=0.0, priors={(NGRAM, 2): 0.45})
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
        policy = _policy(explore=0.0, priors={(NGRAM, 1): 0.3}, batch_margin=margin)
        for n, t in {8: 0.100, 9: 0.101, 12: 0.104}.items():
            policy.observe_target(n, t, seqs=8)
        choices[margin] = policy.plan([SequenceArms() for _ in asks], asks)
    assert not any(c.speculates for c in choices[0.03]), choices[0.03]
    assert choices[0.0][0].speculates, choices[0.0]
    alone = _policy(explore=0.0, priors={(NGRAM, 1): 0.3}, batch_margin=0.5)
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
        policy = _policy(explore=0.0, priors={(NGRAM, 2): 0.3})
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
    policy = _policy()
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
    policy = _policy(explore=0.0, priors={(NGRAM, 2): 0.3})
    for n, t in {16: 0.071, 20: 0.071, 24: 0.074}.items():
        policy.observe_target(n, t, seqs=8)
    asks = [Ask(4, [5, 6, 7, 8], ngram_match=2)] * 8
    assert not policy.target.measured(8, seqs=8)
    assert not any(c.speculates for c in policy.plan([SequenceArms() for _ in asks], asks))
    policy.observe_target(8, 0.050, seqs=8)  # the plain step, timed: 16 tokens cost 1.4x it
    assert policy.target.measured(8, seqs=8)
    assert not any(c.speculates for c in policy.plan([SequenceArms() for _ in asks], asks))
    cheap = _policy(explore=0.0, priors={(NGRAM, 2): 0.3})
    for n, t in {8: 0.068, 16: 0.071, 20: 0.071, 24: 0.074}.items():  # ... or 1.04x it: then it pays
        cheap.observe_target(n, t, seqs=8)
    assert any(c.speculates for c in cheap.plan([SequenceArms() for _ in asks], asks))
    # a single sequence, and a policy that has timed nothing yet, are not held back
    assert _policy(explore=0.0).target.measured(1) and _policy(explore=0.0).target.measured(8, seqs=8)


def test_a_batch_s_plain_pass_is_timed_again_when_its_curve_has_not_seen_one_for_long():
    """8 sequences speculating on every step: the plain 8-token pass was timed once, long ago, and its estimate keeps
    the machine's speed of then. After ``retime_plain`` passes without one the policy takes one plain step, which
    times it again; then it speculates."""
    policy = _policy(explore=0.0, priors={(NGRAM, 2): 0.6}, retime_plain=16)
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

    policy = _policy(explore=0.0, priors={(NGRAM, 3): 0.5})
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


def test_target_costs_are_learned_per_number_of_sequences():
    """8 tokens of 8 sequences cost more than 8 tokens of 2 (each sequence attends on its own), and the slope of a
    full batch is its own: the policy prices a batch's draft tokens on the curve of that batch size (or of the
    nearest one measured)."""
    policy = _policy(explore=0.0)
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
    policy = _policy(explore=0.0, priors={(NGRAM, 2): 0.6})
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
    poor = _policy(explore=0.0, priors={(NGRAM, 2): 0.1})
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
    policy = _policy(explore=0.0, priors={(NGRAM, 2): 0.5})
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
    assert _policy().plan([SequenceArms()], [ask])[0].speculates
    assert _policy(verify_c=0.05, verify_row=0.6).plan([SequenceArms()], [ask])[0].speculates
    dear = _policy(verify_c=0.05, verify_row=1.2)  # a head row costs more than a whole plain step
    assert not dear.plan([SequenceArms()], [ask])[0].speculates
    dear.observe_verify(1, 0.002)  # measured: cheap after all
    dear.observe_verify(5, 0.0025)
    dear.observe_target(1, 0.05)
    assert dear.plan([SequenceArms()], [ask])[0].speculates
    pair = [SequenceArms(), SequenceArms()]
    cheap_k = [c.k for c in _policy(explore=0.0).plan(pair, [ask, ask])]
    dear_k = [c.k for c in _policy(explore=0.0, verify_row=0.3).plan([SequenceArms(), SequenceArms()], [ask, ask])]
    assert sum(dear_k) < sum(cheap_k), (dear_k, cheap_k)


def _serve_bls_steps(drafter, requests: int, steps: int, pass_s, accept: float) -> float:
    """``requests`` BLS requests in lockstep through the adaptive drafter: each step every request plans, the target
    engine runs them as one pass of ``pass_s(requests, tokens)`` seconds (every call's latency), and each proposal is
    accepted token by token with probability ``accept``. Returns the share of request steps that speculated after
    the first ``steps // 4`` (the first feeds the prompt, which teaches no pass cost: its prefix may be cached)."""
    import random

    rng = random.Random(0)
    prompt = [7, 8, 9, 10, 11] * 6  # prompt lookup always finds a match
    clock = [0.0]
    drafter.clock = lambda: clock[0]  # every request's step takes the pass's seconds
    states = [drafter.new_state() for _ in range(requests)]
    speculated = 0
    for step in range(steps):
        planned = [drafter.plan(s, prompt, 4) for s in states]
        fed = sum((len(prompt) if step == 0 else 1) + len(tokens or []) for tokens, _ in planned)
        seconds = pass_s(requests, fed)
        clock[0] += seconds
        for s, (tokens, _) in zip(states, planned):
            n = len(tokens or [])
            accepted = 0
            while accepted < n and rng.random() < accept:
                accepted += 1
            drafter.verdict(s, n, accepted, target_s=seconds)
            speculated += n > 0 and step >= steps // 4
    for s in states:
        drafter.finish(s)
    assert drafter.in_flight == 0
    return speculated / (requests * (steps - steps // 4))


def test_the_bls_drafter_prices_a_draft_at_the_whole_batch_s_step():
    """The BLS orchestrator plans each request alone, but the target engine runs every request in flight in one pass,
    so a call's latency is the whole batch's step. A compute-bound pass at 8 requests (each token 4 ms of a 40 ms
    step) makes a 0.35-acceptance draft a loss there, and a cheap one at 1 request (1 ms of 30) a gain: the drafter
    speculates alone and steps aside at 8. Learned as each request's own pass over its own tokens (as it once was),
    the latency hardly moved with a request's draft, every draft looked free, and all 8 speculated (0.56x
    target-only through Triton)."""
    from trtspec.speculative.drafters.adaptive import AdaptiveLocalDrafter
    from trtspec.speculative.drafters.ngram import NgramDrafter

    def pass_s(seqs: int, tokens: int) -> float:
        return 0.030 + 0.001 * (tokens - 1) if seqs == 1 else 0.040 + 0.004 * (tokens - seqs)

    def drafter() -> AdaptiveLocalDrafter:
        return AdaptiveLocalDrafter(NgramDrafter(None), has_model=False, policy=_policy(explore=0.0))

    assert _serve_bls_steps(drafter(), 1, 60, pass_s, accept=0.35) > 0.8
    # at 8, about one request of the eight takes the cheapest draft (K 1) on a step, not all eight: a plain pass's
    # cost is learned from passes where another request's draft was counted at its last choice, a little above
    # the truth
    assert _serve_bls_steps(drafter(), 8, 60, pass_s, accept=0.35) < 0.2
    # where the batch's pass grows little with its tokens (memory-bound), nearly every request speculates on each
    # step: a pass larger than those timed is priced on the measured slope (on the prior's, as it once was, no
    # request alone made the pass grow past the sizes timed, and about half of them speculated: 0.44)
    assert _serve_bls_steps(drafter(), 8, 60, lambda b, n: 0.040 + 0.0001 * (n - b), accept=0.35) > 0.8
    assert _serve_bls_steps(drafter(), 8, 60, lambda b, n: 0.040 + 0.0001 * (n - b), accept=0.6) > 0.8


def test_the_realized_gate_closes_per_batch_size_where_speculating_did_not_pay_and_probes():
    from trtspec.speculative.gate import RealizedGate

    gate = RealizedGate(probe_every=4)
    for _ in range(3):
        gate.observe(8, False, 32, 32 * 0.040)  # plain stretches: 25 tokens/s
    for _ in range(5):
        gate.observe(8, True, 1, 0.060)  # speculative steps: 1 token in 60 ms, 16.7 tokens/s
    assert gate.allows(8)  # not enough evidence yet
    gate.observe(8, True, 1, 0.060)
    allowed = [gate.allows(8) for _ in range(8)]
    assert allowed == [False, False, False, True] * 2  # closed, one plan in probe_every goes through
    assert gate.closed_plans == 6 and gate.snapshot()[8]["closed"] is True
    assert gate.allows(2) and gate.allows(16)  # other batch sizes have their own evidence
    for _ in range(20):  # the text became predictable: speculative steps now commit 3 tokens in 60 ms
        gate.observe(8, True, 3, 0.060)
    assert all(gate.allows(8) for _ in range(8))


class _EagerPolicy(AdaptivePolicy):
    """Speculates for every sequence with an n-gram proposal, as long as it may, whatever it costs: a policy whose
    estimates are wrong at a batch."""

    def plan(self, seqs, asks, batch_seqs=None, others=None):
        out = []
        for seq, ask in zip(seqs, asks):
            k = min(ask.k_max, len(ask.ngram_tokens))
            choice = Choice(NGRAM, k, (NGRAM, 4)) if k else Choice()
            seq.last = (choice.arm, choice.k) if choice.speculates else None
            out.append(choice)
        return out


def test_the_bls_drafter_steps_aside_where_its_speculation_did_not_pay_as_the_requests_saw_it():
    """A policy that always speculates (mispriced: the pass model misses what a call costs at a batch) at 8 requests
    in flight, where a speculative step is an engine call that waits for the batch's step boundary (1.3 tokens in
    90 ms) and a plain stretch streams a token every 40 ms: the gate stops the drafts at 8 (but for its probes)
    and the plain stretches grow to gated_run; alone, nothing is gated."""
    from trtspec.speculative.drafters.adaptive import AdaptiveLocalDrafter
    from trtspec.speculative.drafters.ngram import NgramDrafter

    clock = [0.0]
    prompt = [7, 8, 9, 10, 11] * 6  # prompt lookup always finds a match

    def serve(requests: int, steps: int) -> tuple[int, list[int]]:
        d = AdaptiveLocalDrafter(NgramDrafter(None), has_model=False, policy=_EagerPolicy())
        d.clock = lambda: clock[0]
        states = [d.new_state() for _ in range(requests)]
        drafted, runs = 0, []
        for step in range(steps):
            for s in states:  # each request's loop on its own clock offset; the others in flight as they chose
                tokens, _ = d.plan(s, prompt, 4)
                if tokens:
                    clock[0] += 0.090
                    d.verdict(s, len(tokens), 0 if step % 3 else 1, target_s=0.090)
                    drafted += step >= steps // 2
                else:
                    run = d.plain_run(s)
                    clock[0] += 0.040 * run
                    d.verdict(s, 0, 0, target_s=0.040 * run, plain_tokens=run)
                    runs.append(run)
        return drafted, runs

    drafted, runs = serve(8, 40)
    assert drafted <= 8 * 20 / 8 + 8  # about one plan in probe_every, after the evidence closed the gate
    assert max(runs) == AdaptiveLocalDrafter(NgramDrafter(None), has_model=False).gated_run
    drafted, runs = serve(1, 40)
    assert drafted == 20 and not runs  # alone: the pass model prices a call as it is, nothing is gated


def test_the_policy_counts_what_it_chose():
    policy = _policy(priors={(NGRAM, 4): 0.9})  # a quote: it pays in a batch of two
    policy.plan([SequenceArms(), SequenceArms()], [Ask(4, [1, 2, 3, 4], ngram_match=4), Ask(0)])
    snap = policy.snapshot()
    assert snap["steps"] == {NGRAM: 1, MODEL: 0, "none": 1}
    assert snap["no_speculation_share"] == 0.5 and snap["k_chosen"] == {0: 1, 4: 1}


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


@pytest.fixture(scope="module")
def tiny_models(tiny_pair):
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer

    return load_model(tiny_pair[0]), load_model(tiny_pair[1]), load_tokenizer(tiny_pair[0])


PROMPTS = ["The quick brown", "def add(a, b):\n    return a", "Q: What is the capital of France? A:", "the lazy dog"]


@pytest.mark.parametrize("policy_cls", [SwitchingPolicy, AdaptivePolicy])
def test_adaptive_drafting_is_greedy_lossless_batched_and_not(tiny_models, policy_cls):
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder
    from trtspec.speculative.drafters.ngram import NgramPool

    target, draft, tok = tiny_models
    prompts = [tok.encode(p) for p in PROMPTS]
    base = SpeculativeDecoder(target, None)
    reference = [base.generate([p], 40)[0].token_ids for p in prompts]
    pool = NgramPool.from_sequences([p + r for p, r in zip(prompts[::2], reference[::2])], vocab_size=len(tok))
    policy = policy_cls()
    dec = SpeculativeDecoder(target, draft, max_draft_len=4, drafter="adaptive", ngram_pool=pool, policy=policy)
    single = [dec.generate([p], 40)[0] for p in prompts]
    assert [r.token_ids for r in single] == reference
    batch = dec.generate(prompts, 40)
    assert [r.token_ids for r in batch] == reference
    if policy_cls is SwitchingPolicy:  # every choice was exercised, drafts accepted and rejected
        assert all(policy.steps[s] > 0 for s in (NGRAM, MODEL, "none")), policy.steps
        drafted = sum(r.stats.total_draft_tokens for r in single + batch)
        accepted = sum(r.stats.total_accepted_draft_tokens for r in single + batch)
        assert drafted > accepted > 0
        assert all(r.stats.no_draft_steps > 0 for r in batch)
    else:  # the real policy learned the target's pass costs from the engine's passes
        assert policy.target.seconds, policy.snapshot()
        # ... and the verification's cost by rows kept (head and acceptance routine), a pass of 4 sequences included
        assert policy.verify.seconds and max(policy.verify.seconds) >= len(prompts), policy.snapshot()
        # ... per number of sequences in the pass: alone (the single runs) and the four of the batch
        assert {1, len(prompts)} <= set(policy.target.curves), policy.snapshot()


def test_an_anchored_curve_keeps_the_measured_shape_and_takes_the_live_scale():
    """Anchored on a controlled measurement, a curve's shape stays the measurement's whatever live passes say; live
    passes only move its scale (the median of their ratios), so one noisy size cannot reshape it."""
    costs = PassCosts(CostPrior(target_slope=0.1).target)
    costs.anchor({1: 0.040, 2: 0.041, 3: 0.044, 5: 0.048})
    assert costs.cost(4) == pytest.approx(0.046)  # interpolated between measured sizes
    assert costs.cost(7) == pytest.approx(0.048 + 2 * 0.002)  # the measured slope beyond them
    for _ in range(5):
        costs.observe(2, 0.041 * 1.5)  # a slow stretch: the 2-token passes run 1.5x the measurement
    costs.observe(1, 0.040 * 1.5)
    assert costs.drift == pytest.approx(1.5)
    assert costs.cost(2) / costs.cost(1) == pytest.approx(0.041 / 0.040)  # the shape is the measurement's
    costs.observe(3, 0.044 * 9)  # one outlier does not move the median
    assert costs.drift == pytest.approx(1.5)


def test_anchored_batch_curves_interpolate_between_measured_batches_and_share_one_drift():
    from trtspec.speculative.pass_costs import BatchPassCosts

    costs = BatchPassCosts(CostPrior().target)
    costs.anchor({1: {1: 0.04, 2: 0.05}, 4: {4: 0.08, 8: 0.12}})
    assert costs.cost(1, 1) == pytest.approx(0.04)
    assert costs.cost(4, 4) == pytest.approx(0.08)
    # 2 sequences: a third of the way from 1 to 4, at each token count
    assert costs.cost(4, 2) == pytest.approx(costs.curve(1).shape(4) + (0.08 - costs.curve(1).shape(4)) / 3)
    costs.observe(8, 0.24, seqs=4)  # twice the shape
    assert costs.cost(1, 1) == pytest.approx(0.08) and costs.cost(4, 4) == pytest.approx(0.16)
    costs.observe(20, 1.0, seqs=16)  # beyond the anchored batches: learned live
    assert costs.cost(20, 16) == pytest.approx(1.0)


def test_calibrate_anchors_the_policy_on_the_engine_s_passes(tiny_models):
    """At an engine's start (calibrate_costs) the policy's curves are anchored on passes timed here, per batch size up
    to the engine's, and decoding stays the target's."""
    from trtspec.runtimes.inflight.engine import InflightEngine
    from trtspec.speculative.drafters.adaptive import AdaptiveEngineDrafter
    from trtspec.speculative.drafters.ngram import NgramDrafter

    target, _draft = tiny_models[:2]
    policy = AdaptivePolicy()
    drafter = AdaptiveEngineDrafter(NgramDrafter(), int(target.config.vocab_size), policy=policy)
    InflightEngine(target, drafter=drafter, max_batch_size=4, calibrate_costs=True)
    assert policy.calibrated == {1, 2, 4}
    snap = policy.snapshot()["target_anchor_s"]
    assert set(snap) >= {1, 2, 4} and sorted(snap[1]) == [1, 2, 3, 4, 5, 7, 9]
    assert all(t > 0 for c in snap.values() for t in c.values())


class _Job:
    """What the engine drafter reads of a job: its sequence, the tokens it feeds anyway, its sampling."""

    def __init__(self, tokens, sampling=None):
        self.tokens, self.pending, self.sampling, self.draft_state = list(tokens), [tokens[-1]], sampling, None
        self.stats = types.SimpleNamespace(draft_s=0.0)

    def history(self):
        return self.tokens


class _QuietPolicy(AdaptivePolicy):
    """Chooses no speculation for anybody, except at the plans numbered in ``speculate_at`` (n-grams, K 1)."""

    def __init__(self, speculate_at=()):
        super().__init__()
        self.plans, self.speculate_at = [], set(speculate_at)

    def plan(self, seqs, asks, batch_seqs=None):
        self.plans.append(batch_seqs)
        if len(self.plans) - 1 in self.speculate_at:
            return [Choice(NGRAM, 1, (NGRAM, 1)) if a.ngram_tokens else Choice() for a in asks]
        self.record_plain(len(seqs))
        return [Choice() for _ in seqs]


def _drafter(policy, jobs):
    from trtspec.speculative.drafters.adaptive import AdaptiveEngineDrafter
    from trtspec.speculative.drafters.ngram import NgramDrafter

    drafter = AdaptiveEngineDrafter(NgramDrafter(), 100, policy=policy)
    for job in jobs:
        drafter.admit(job)
    return drafter


def _step(drafter, jobs):
    out = drafter.propose(jobs, [4] * len(jobs), batch_tokens=len(jobs), batch_seqs=len(jobs))
    for job, p in zip(jobs, out):
        drafter.commit(job, len(job.tokens), len(p.tokens), 0)
    return out


def test_the_engine_drafter_stops_choosing_where_nobody_speculates_and_plans_again_when_the_batch_shrinks():
    """At a batch where the plan speculated for nobody, proposing and choosing are the only loss (36.7 against 34.8
    ms a step at 8 conversations): the drafter skips them for 1, 2, 4, 8, 16 steps after each such plan in a row."""
    repeat = [5, 6, 7, 5, 6, 7, 5, 6]  # every job has an n-gram proposal
    jobs = [_Job(repeat) for _ in range(4)]
    policy = _QuietPolicy()
    drafter = _drafter(policy, jobs)
    outs = [_step(drafter, jobs) for _ in range(40)]
    assert all(not p.tokens for out in outs for p in out)
    assert len(policy.plans) == 6  # plans at steps 0, 2, 5, 10, 19, 36; the others skipped
    assert drafter.skipped_steps == 34 and policy.steps["none"] == 40 * 4 and policy.k_chosen[0] == 160
    _step(drafter, jobs[:3])  # the batch shrank: fewer sequences may pay, so it plans at once
    assert len(policy.plans) == 7 and policy.plans[-1] == 3
    # a batch of one is never skipped (alone, speculation is judged every step)
    one = [_Job(repeat)]
    alone = _QuietPolicy()
    drafter = _drafter(alone, one)
    for _ in range(5):
        _step(drafter, one)
    assert len(alone.plans) == 5 and drafter.skipped_steps == 0


def test_a_plan_that_speculates_or_a_seeded_request_keeps_the_drafter_choosing_every_step():
    from trtspec.speculative.rules import SamplingParams

    repeat = [5, 6, 7, 5, 6, 7, 5, 6]
    jobs = [_Job(repeat) for _ in range(4)]
    policy = _QuietPolicy(speculate_at={2})
    drafter = _drafter(policy, jobs)
    outs = [_step(drafter, jobs) for _ in range(6)]
    # plan 0 (step 0) quiet -> skip step 1; plan 1 (step 2) quiet -> skip 3, 4; plan 2 (step 5) speculates
    assert len(policy.plans) == 3 and [bool(o[0].tokens) for o in outs] == [False] * 5 + [True]
    _step(drafter, jobs)  # after a plan that speculated: no skipping
    assert len(policy.plans) == 4
    # a seeded sampled request's choices must not depend on the batch: with one in it, every step plans
    seeded = [_Job(repeat, SamplingParams(temperature=0.8, seed=1))] + [_Job(repeat) for _ in range(3)]
    policy = _QuietPolicy()
    drafter = _drafter(policy, seeded)
    for _ in range(6):
        _step(drafter, seeded)
    assert len(policy.plans) == 6 and drafter.skipped_steps == 0


def _timed_steps(drafter, jobs, steps, spec_s, plain_s, accepted, feed=1):
    """``steps`` engine steps on a fake clock: a speculative step takes ``spec_s`` and accepts ``accepted`` per
    sequence, a plain one ``plain_s``; each sequence feeds ``feed`` tokens (more than 1: a prompt's); returns which
    steps speculated."""
    clock = [0.0]
    drafter.clock = lambda: clock[0]
    spoke = []
    for _ in range(steps):
        out = drafter.propose(jobs, [4] * len(jobs), batch_tokens=feed * len(jobs), batch_seqs=len(jobs))
        speculated = any(p.tokens for p in out)
        clock[0] += spec_s if speculated else plain_s
        drafter.observe_pass(len(jobs), 0.001, seqs=len(jobs))
        for job, p in zip(jobs, out):
            drafter.commit(job, len(job.tokens), len(p.tokens), accepted if p.tokens else 0)
        spoke.append(speculated)
    return spoke


def test_the_engine_drafter_gates_a_batch_size_where_speculating_realized_less_than_plain_steps():
    """A policy that always speculates at 4 sequences, where a speculative step takes 60 ms for 1.25 tokens a
    sequence and a plain one 40 ms for 1 (20.8 against 25 tokens/s a sequence): once the gate has the evidence it
    passes one plan in probe_every (the probe, speculative), and the rest are plain steps; where speculation pays
    (2 tokens a sequence in 60 ms) nothing is gated, nor is a sequence alone however it does."""
    repeat = [5, 6, 7, 5, 6, 7, 5, 6]  # every job has an n-gram proposal
    jobs = [_Job(repeat) for _ in range(4)]
    drafter = _drafter(_EagerPolicy(), jobs)
    for _ in range(3):  # plain steps to weigh against (the gate asks for a few of each kind)
        drafter.gate.observe(4, False, 4, 0.040)
    spoke = _timed_steps(drafter, jobs, 64, spec_s=0.060, plain_s=0.040, accepted=0.25)
    assert all(spoke[:5])  # no evidence yet
    late = spoke[32:]
    assert sum(late) == len(late) // drafter.gate.probe_every  # probes only
    assert drafter.gate.snapshot()[4]["closed"] is True

    jobs = [_Job(repeat) for _ in range(4)]
    drafter = _drafter(_EagerPolicy(), jobs)
    for _ in range(3):
        drafter.gate.observe(4, False, 4, 0.040)
    spoke = _timed_steps(drafter, jobs, 64, spec_s=0.060, plain_s=0.040, accepted=1)
    assert all(spoke) and drafter.gate.snapshot()[4]["closed"] is False

    # steps that feed prompts are not evidence (a prefill's cost is paid whatever the choice)
    jobs = [_Job(repeat) for _ in range(4)]
    drafter = _drafter(_EagerPolicy(), jobs)
    assert all(_timed_steps(drafter, jobs, 16, spec_s=0.060, plain_s=0.040, accepted=0, feed=3))
    assert drafter.gate.snapshot() == {4: {"spec_tok_s": 0.0, "plain_tok_s": 0.0, "closed": False}}

    one = [_Job(repeat)]
    drafter = _drafter(_EagerPolicy(), one)
    for _ in range(3):
        drafter.gate.observe(1, False, 1, 0.010)
    assert all(_timed_steps(drafter, one, 32, spec_s=0.060, plain_s=0.010, accepted=0))
    assert drafter.gate.snapshot() == {1: {"spec_tok_s": 0.0, "plain_tok_s": 100.0, "closed": False}}


class _PhasedPolicy(SwitchingPolicy):
    """SwitchingPolicy's choices at every fourth plan, no speculation for anybody at the others: the engine drafter
    then skips steps, and comes back."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.plans = 0

    def plan(self, seqs, asks, batch_seqs=None):
        self.plans += 1
        if self.plans % 4 == 1:
            return super().plan(seqs, asks, batch_seqs)
        self.record_plain(len(seqs))
        return [Choice() for _ in seqs]


def test_skipped_steps_keep_adaptive_drafting_greedy_lossless_batched(tiny_models):
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder

    target, draft, tok = tiny_models
    prompts = [tok.encode(p) for p in PROMPTS]
    base = SpeculativeDecoder(target, None)
    reference = [base.generate([p], 40)[0].token_ids for p in prompts]
    policy = _PhasedPolicy()
    dec = SpeculativeDecoder(target, draft, max_draft_len=4, drafter="adaptive", policy=policy)
    batch = dec.generate(prompts, 40)
    assert [r.token_ids for r in batch] == reference
    drafter = dec._engines[True].drafter
    assert drafter.skipped_steps > 0 and policy.steps[MODEL] > 0, policy.steps
    assert sum(r.stats.total_draft_tokens for r in batch) > 0
