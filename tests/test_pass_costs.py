"""The target's pass costs as adaptive speculation learns them (trtspec.speculative.pass_costs): the prior until
measured, the isotonic fit of the measurements, the machine's drift shared by every size and batch, interpolation
and anchoring on a calibration."""

from __future__ import annotations

import pytest

from tests.adaptive_helpers import cpu_like_policy
from trtspec.speculative.arms import NGRAM, SequenceArms, expected_accepted
from trtspec.speculative.choice import Ask
from trtspec.speculative.pass_costs import (
    REFIT_TOL,
    STALE_PASSES,
    STALE_PASSES_MAX,
    CostPrior,
    PassCosts,
    isotonic,
)


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
    policy = cpu_like_policy(explore=0.0, priors={(NGRAM, 4): 0.64})
    for n, t in raw.items():
        policy.observe_target(n, t)
    (choice,) = policy.plan([SequenceArms()], [Ask(4, [5, 6, 7, 8], ngram_match=4)])
    assert choice.k == 4, choice
    a = policy.acceptance(SequenceArms(), (NGRAM, 4))
    on_raw = {k: (1 + expected_accepted(a, k)) / raw[1 + k] for k in range(5)}
    assert max(on_raw, key=on_raw.__getitem__) == 2, on_raw  # what the raw averages would have chosen


def test_a_size_re_timed_at_its_price_waits_longer_to_be_timed_again_and_one_that_moved_does_not():
    """A 9-token pass that is dear in fact (compute-bound on this CPU) is found at its price each time the policy
    re-times it: each such confirmation doubles how long it may go unmeasured (up to STALE_PASSES_MAX); a re-timing
    that finds it elsewhere brings the wait back to STALE_PASSES."""
    costs = PassCosts(CostPrior().target)
    for _ in range(4):
        costs.observe(1, 0.010)
        costs.observe(9, 0.020)

    def unmeasured_for(n: int) -> None:
        for _ in range(n):
            costs.observe(1, 0.010)

    unmeasured_for(STALE_PASSES - 1)
    assert costs.fresh(9)
    unmeasured_for(1)
    assert not costs.fresh(9) and costs.measured(9)
    waits = []
    for _ in range(6):  # re-timed at its price: 128, 256, 512, 1024, 1024, ... passes before the next
        costs.observe(9, 0.0201)
        n = 0
        while costs.fresh(9):
            unmeasured_for(1)
            n += 1
        waits.append(n)
    assert waits == [128, 256, 512, 1024, STALE_PASSES_MAX, STALE_PASSES_MAX], waits
    costs.observe(9, 0.013)  # the size moved (35 % below its price): back to the short wait
    n = 0
    while costs.fresh(9):
        unmeasured_for(1)
        n += 1
    assert n == STALE_PASSES


def test_the_live_fit_kept_up_pass_by_pass_is_the_full_fit():
    """A pass that leaves the shapes in order moves only its own size's fit, and one that moves a size out of order
    by less than REFIT_TOL leaves the fit as it is (the full fit is not redone every pass); whatever the order of
    passes, the fit must be the full weighted isotonic fit of the shapes, within REFIT_TOL."""
    import math
    import random

    rng = random.Random(3)
    costs = PassCosts(CostPrior().target)
    shortcuts = exact = 0
    for i in range(3000):
        n = rng.choice([1, 2, 3, 4, 5, 5, 5, 8, 24, 96])
        slow = 1.4 if (i // 200) % 3 == 2 else 1.0  # the machine's speed moves in stretches
        costs.observe(n, 0.01 * (1 + 0.06 * n) * slow * rng.uniform(0.8, 1.25))
        full = isotonic(
            {b: math.exp(v) for b, v in costs._log_shape.items()},
            {b: float(min(64, k)) for b, k in costs._passes.items()},
        )
        assert costs._fit == pytest.approx(full, rel=REFIT_TOL)
        shortcuts += costs._ordered
        exact += costs._fit == pytest.approx(full, rel=1e-12)
    assert 0 < shortcuts < 3000  # both ways were taken
    assert exact < 3000  # ... and refits were skipped


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
