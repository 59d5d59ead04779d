"""What a pass costs, as the adaptive policy prices its choices (trtspec.speculative.adaptive): seconds of one
target pass by the tokens it feeds (one curve per number of sequences in the pass), of a draft-model round by its
rows, and of verifying a pass's rows, before anything is measured (``CostPrior``: relative units from `trtspec tune`'s
c and v, or this CPU's defaults) and as measured.

Two ways to measure. Live: every pass the engine runs is recorded (``observe``) into a model of two factors,
seconds = drift x shape(size): the drift is the machine's speed now, shared by every size and moved quickly by every
pass; a size's shape moves slowly and only by its own passes, and the curve used is the shape's non-decreasing fit.
(The curve was once one median of the last passes per size. On a 2-vCPU VM whose speed moved 30-40 % between
adjacent prompts, the sizes a policy chooses rarely (2-3 tokens) kept whatever the machine's speed was when they
were last chosen, medians 20-40 % above a controlled measurement; the isotonic fit pooled them with the sizes chosen
every step, and the policy took fewer tokens per step than on the controlled curve: workloads replayed, 1.45x on the
live curve, 1.51x on the controlled one.) Anchored: the curve's shape is taken from a controlled measurement made
once, at start, with every size timed in turn on an idle engine (``anchor``;
trtspec.runtimes.inflight.timing.calibrate), and live passes only move the drift (the median of their last ratios to
the shape). Timed, anchoring did not pay on that VM (geometric mean 1.318x anchored against 1.330x on the median
curves, n-grams K <= 4, one run), so engines learn live unless told to calibrate. A size unmeasured for
``STALE_PASSES`` passes of its curve is stale: its next pass weighs as much as all its old ones, and the policy takes
such a size once alone to time it again (trtspec.speculative.adaptive). A re-timing that finds the size where it was
priced (within ``CONFIRM_LOG``) doubles how long that size may go unmeasured, up to ``STALE_PASSES_MAX``; one that
does not brings it back to ``STALE_PASSES``. So a size that is dear in fact is not re-timed every 64 passes (measured,
the workload benchmark with K up to 8, one sequence: 7- to 9-token passes cost 1.6-1.9x a one-token pass on this CPU,
and re-timing them took 27 of 895 steps). Pure Python.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

# Before a pass size is measured, its cost relative to a one-token target pass: 1 + slope * extra tokens (this CPU's
# v = 1.3 at K 4 for the target; c = 0.11 for the draft's first row, 0.02 per extra row).
DEFAULT_TARGET_SLOPE = 0.075
DEFAULT_DRAFT_C = 0.11
DEFAULT_DRAFT_ROW = 0.02
# ... and of verifying a pass's rows (the vocabulary head and the acceptance routine): 0.05 of a step for one row (the
# head read once), then per row (measured, bfloat16, 8 sequences: 2.3 ms for 8 rows, 4.4 for 40, against 46 ms a
# step; the acceptance routine's Python adds 0.1-0.2 ms a row).
DEFAULT_VERIFY_C = 0.05
DEFAULT_VERIFY_ROW = 0.004
# Anchored curves: the live passes whose ratios to the controlled shape set its scale (the median of these).
DRIFT_WINDOW = 31
# Live curves: seconds = drift (the machine's speed now, shared by every size) x shape (per size), learned in logs
# from every pass's residual (clipped at DRIFT_CLIP: one slow pass moves either little), the drift fast and the shape
# slowly (a size's running mean over its first passes, then SHAPE_RATE), so that a change every size sees is taken
# as the machine's and a size measured only during a slow stretch is not priced at that stretch's speed for good.
DRIFT_RATE = 0.1
SHAPE_RATE = 0.02
DRIFT_CLIP = 0.25
SHAPE_WEIGHT_CAP = 64  # the isotonic fit weighs a size by its passes, up to this many
# A size not measured among its curve's last so many passes is stale: the policy may choose it once to time it again
# (trtspec.speculative.adaptive), and that pass weighs as much as all its old ones.
STALE_PASSES = 64
STALE_PASSES_MAX = 1024  # ... doubled after each re-timing that confirmed the size's price, up to this
CONFIRM_LOG = 0.1  # a re-timed pass within about 10 % of its size's fitted price confirms it
# Shapes out of order (the fit pools some of them): a size past its weight cap is fitted again once its shape moved
# this share since the last fit, so the fit stays within it of the full fit (isotonic regression does not move
# further than its inputs). A pass moves a shape by at most SHAPE_RATE x DRIFT_CLIP (0.5 %) there, and refitting on
# every one was most of what learning a pass cost.
REFIT_TOL = 0.01


@dataclass
class Drift:
    """A live curve's drift (log seconds per shape unit: the machine's speed now); one object may serve several
    curves of the same passes (BatchPassCosts: every number of sequences)."""

    log: float | None = None


class PassCosts:
    """Seconds of one pass as a function of its size (tokens fed, draft rows, or rows verified), learned from measured
    passes.

    A pass is recorded at the nearest size of BUCKETS (exact up to 16, then spaced a quarter to a half apart) as
    log seconds = log drift + log shape(bucket): a bucket's first pass sets its shape at the drift of the moment; after
    that the pass's residual (clipped at DRIFT_CLIP: one slow pass, a page fault or a timer, moves either factor
    little; an exponential average of raw seconds once kept such a pass for dozens of steps) moves the drift by
    DRIFT_RATE and the bucket's shape by its running mean's weight, down to SHAPE_RATE. A slowdown that every size
    sees is so taken as the machine's within a few dozen passes, and the ratio between two sizes is learned from
    passes measured in the same stretch, not priced at the speed of the stretch in which a size was last chosen. The
    shapes used are their isotonic (non-decreasing in size) least-squares fit, weighted by the passes behind each: a
    pass over more tokens does not cost less than one over fewer, and
    where passes of 1-5 tokens cost about the same (a memory-bound step: the bfloat16 CPU path, GPUs) the averages'
    noise otherwise ranks them at random (measured: 55, 75, 56, 77, 51 ms for 1..5 tokens in one run, which made the
    policy prefer 3 tokens to 2 and 5 to 4). Between two measured buckets the cost is interpolated linearly: a batch
    of 8 sequences feeds 8 to 40 tokens a step, and rounding a size up to the next bucket (as this class once did)
    priced 17 tokens as 24 and made the step after a few sequences' drafts look far dearer than it is, so speculation
    backed off at concurrency where it paid. Above the measured sizes the cost grows at the measured slope (the
    steeper of the last segment's and the whole measured range's): priced on the prior's shape there (as it once
    was), a pass larger than any timed looked as dear per token as a one-token pass's slope makes it, and where the
    step is memory-bound (8 requests through the BLS orchestrator, a pass of 8-40 tokens costing about one of 8) no
    request alone grew the pass past the sizes timed, so about half of them speculated where all should (a lockstep
    simulation: 0.44 of the requests' steps, 0.88 on the measured slope; compute-bound, 0.11 either way). Below the
    measured sizes, or with one size measured, the cost follows ``prior(size)`` (relative units) anchored at the
    nearest measured bucket (before anything is measured: scaled by ``scale_from``'s seconds per unit, or in
    relative units).

    Anchored (``anchor``): the shape is a controlled measurement's (its isotonic fit, interpolated between its sizes,
    beyond them as above) and a live pass only moves the scale: the curve is the shape times the median of
    the last ``DRIFT_WINDOW`` ratios of a measured pass to the shape at its size."""

    BUCKETS = (
        *range(1, 17),
        20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
    )  # fmt: skip

    def __init__(self, prior: Any, alpha: float = 0.2, scale_from: Any = None, drift: Drift | None = None) -> None:
        self.prior = prior
        self.alpha = alpha
        self.scale_from = scale_from  # whose ``scale`` to use before this one has measured anything
        self._log_shape: dict[int, float] = {}  # live, per bucket: log seconds at drift 1
        self._passes: dict[int, int] = {}  # live, per bucket: passes seen
        self._observed = 0  # live: passes seen, all sizes
        self._last_seen: dict[int, int] = {}  # live, per bucket: ``_observed`` at its last pass
        self._stale_after: dict[int, int] = {}  # live, per bucket: passes unmeasured before it is stale
        self._drift_of = drift if drift is not None else Drift()  # live: the machine's speed (may be shared)
        self._raw: dict[int, float] = {}  # live, per bucket: exp of its log shape
        self._fit: dict[int, float] = {}  # live, per bucket: the isotonic fit of the shape (seconds at drift 1)
        self._ordered = True  # live: the fit is the shapes themselves (they are non-decreasing in size)
        self._fitted_at: dict[int, float] = {}  # live, per bucket: its shape when the shapes were last fitted
        self._sizes: list[int] = []  # the measured buckets, ascending
        self.scale: float | None = None  # seconds per prior unit
        self.anchored: dict[int, float] = {}  # per size: the controlled measurement's fit (empty: live)
        self._ratios: deque[float] = deque(maxlen=DRIFT_WINDOW)  # anchored: measured pass / shape, the last ones
        self._anchor_sizes: list[int] = []
        self._drift = 1.0

    def anchor(self, seconds: dict[int, float]) -> None:
        """Take the curve's shape from ``seconds`` (per size, measured in turn on an idle engine); from now on a
        measured pass only moves the curve's scale."""
        good = {int(n): float(t) for n, t in seconds.items() if n > 0 and t > 0 and math.isfinite(t)}
        if not good:
            return
        self.anchored = isotonic(good)
        self._anchor_sizes = sorted(self.anchored)
        self._ratios.clear()
        self._drift = 1.0
        self.scale = self.cost(1) / max(1e-12, float(self.prior(1)))

    @property
    def drift(self) -> float:
        """Anchored: how far live passes run from the controlled shape (1: as measured)."""
        return self._drift

    def set_drift(self, drift: float) -> None:
        """Anchored: the scale a shared measurement found (trtspec.speculative.pass_costs.BatchPassCosts)."""
        self._drift = drift
        self.scale = self.cost(1) / max(1e-12, float(self.prior(1)))

    def shape(self, size: int) -> float:
        """Anchored: the controlled measurement's seconds at ``size`` (interpolated, the prior's shape beyond)."""
        return _interpolated(self.anchored, self._anchor_sizes, self.prior, size)

    @classmethod
    def _bucket(cls, size: int) -> int:
        """The nearest bucket to ``size`` (the lower one on a tie)."""
        size = max(1, size)
        i = bisect.bisect_left(cls.BUCKETS, size)
        if i >= len(cls.BUCKETS):
            return cls.BUCKETS[-1]
        hi = cls.BUCKETS[i]
        if hi == size or i == 0:
            return hi
        lo = cls.BUCKETS[i - 1]
        return lo if size - lo <= hi - size else hi

    def observe(self, size: int, seconds: float) -> None:
        if size <= 0 or seconds <= 0 or not math.isfinite(seconds):
            return
        if self.anchored:
            self._ratios.append(seconds / max(1e-12, self.shape(size)))
            self._drift = statistics.median(self._ratios)
            self.scale = self.cost(1) / max(1e-12, float(self.prior(1)))
            return
        b = self._bucket(size)
        self._observed += 1
        y = math.log(seconds)
        drift = self._drift_of
        last = self._last_seen.get(b)
        window = self._stale_after.get(b, STALE_PASSES)
        retimed = last is not None and self._observed - last > window
        if retimed:
            # Measured anew after a long while: its old passes may all come from one slow stretch (a size the
            # policy then stopped choosing, for the price they gave it), so this pass counts as much as they do.
            # Where it finds the size at its price, the size is dear in fact: it waits twice as long to be re-timed.
            priced = math.log(self._fit.get(b, self._raw[b])) + (drift.log or 0.0)
            confirmed = abs(y - priced) <= CONFIRM_LOG
            self._stale_after[b] = min(STALE_PASSES_MAX, 2 * window) if confirmed else STALE_PASSES
            self._passes[b] = min(self._passes[b], 1)
        self._last_seen[b] = self._observed
        if drift.log is None:  # the first pass sets the scale: shape units are the prior's at first
            drift.log = y - math.log(max(1e-12, float(self.prior(size))))
        shape = self._log_shape.get(b)
        if shape is None:  # a size's first pass: its shape at today's drift
            self._log_shape[b] = y - drift.log
            self._passes[b] = 1
        else:
            residual = max(-DRIFT_CLIP, min(DRIFT_CLIP, y - drift.log - shape))
            n = self._passes[b] = self._passes[b] + 1
            drift.log += DRIFT_RATE * residual
            self._log_shape[b] = shape + max(SHAPE_RATE, 1.0 / n) * residual
        self._refit(b, shape is None, reweighted=retimed)
        ratio = seconds / max(1e-12, float(self.prior(size)))
        self.scale = ratio if self.scale is None else self.scale + self.alpha * (ratio - self.scale)

    def _refit(self, b: int, new: bool, reweighted: bool = False) -> None:
        """The isotonic fit after bucket ``b``'s shape moved (``new``: its first pass; ``reweighted``: its weight
        changed). Where the shapes were in order and ``b``'s still is between its neighbours', the fit is the shapes
        themselves and only ``b`` moves; out of order, the fit is made again once ``b`` moved by REFIT_TOL (every
        pass of every step comes here: the full fit over a dozen buckets was a third of the policy's time per step
        at batch 1)."""
        value = self._raw[b] = math.exp(self._log_shape[b])
        if new:
            self._sizes = sorted(self._raw)
        elif self._ordered:
            i = bisect.bisect_left(self._sizes, b)
            below = self._raw[self._sizes[i - 1]] if i > 0 else -math.inf
            above = self._raw[self._sizes[i + 1]] if i + 1 < len(self._sizes) else math.inf
            if below <= value <= above:
                self._fit[b] = value
                return
        elif (
            not reweighted
            and self._passes[b] > SHAPE_WEIGHT_CAP  # its weight has not changed since the last fit
            and abs(value - self._fitted_at.get(b, 0.0)) <= REFIT_TOL * value
        ):
            return
        # weighted by the passes behind each estimate: a size chosen rarely (one noisy pass) must not pull the sizes
        # chosen every step up to itself (measured: K 1 and K 2 chosen a few times at 41 and 51 ms pooled K 3 and 4's
        # 33 ms up to 40, and the policy then stepped aside on a fifth of its steps)
        self._fit = isotonic(self._raw, {k: float(min(SHAPE_WEIGHT_CAP, n)) for k, n in self._passes.items()})
        self._fitted_at = dict(self._raw)
        self._ordered = all(self._fit[k] == self._raw[k] for k in self._sizes)

    def measured(self, size: int, within: int | None = None) -> bool:
        """Whether a pass of about ``size`` (its bucket) has been timed (``within``: among the curve's last so many
        passes), or the curve is anchored."""
        if self.anchored:
            return True
        seen = self._last_seen.get(self._bucket(size))
        return seen is not None and (within is None or self._observed - seen < within)

    def fresh(self, size: int) -> bool:
        """Whether a pass of about ``size`` has been timed recently enough not to be timed again on purpose: among
        the curve's last ``STALE_PASSES`` passes, or more for a size whose re-timings confirmed its price (module
        docstring); always when the curve is anchored."""
        if self.anchored:
            return True
        b = self._bucket(size)
        seen = self._last_seen.get(b)
        return seen is not None and self._observed - seen < self._stale_after.get(b, STALE_PASSES)

    @property
    def live_drift(self) -> float:
        """Live: the machine's speed factor now (seconds per shape unit)."""
        return math.exp(self._drift_of.log) if self._drift_of.log is not None else 1.0

    @property
    def seconds(self) -> dict[int, float]:
        """Live: per measured bucket, its shape at the current drift (seconds)."""
        d = self.live_drift
        return {b: math.exp(v) * d for b, v in sorted(self._log_shape.items())}

    @property
    def fitted(self) -> dict[int, float]:
        """Live: per measured bucket, the isotonic fit of ``seconds``."""
        d = self.live_drift
        return {b: v * d for b, v in self._fit.items()}

    def cost(self, size: int) -> float:
        """Estimated seconds (relative units until anything is measured)."""
        if size <= 0:
            return 0.0
        if self.anchored:
            return self.shape(size) * self.drift
        if not self._sizes:
            scale = self.scale_from.scale if self.scale_from is not None else None
            return float(self.prior(size)) * (scale if scale is not None else 1.0)
        return _interpolated(self._fit, self._sizes, self.prior, size) * self.live_drift


def _interpolated(fitted: dict[int, float], sizes: list[int], prior: Any, size: int) -> float:
    """``fitted`` (measured sizes ``sizes``, ascending, not empty) at ``size``: exact, linear between two measured
    sizes, above them on the measured slope (the steeper of the last segment's and the whole range's; one size
    measured: the prior's shape from it), below them the prior's shape from the nearest."""
    i = bisect.bisect_left(sizes, size)
    if i < len(sizes) and sizes[i] == size:
        return fitted[size]
    if 0 < i < len(sizes):  # between two measured sizes
        lo, hi = sizes[i - 1], sizes[i]
        return fitted[lo] + (fitted[hi] - fitted[lo]) * (size - lo) / (hi - lo)
    if i == len(sizes) and len(sizes) >= 2:  # above them: the measured slope (module docstring)
        lo, below, hi = sizes[0], sizes[-2], sizes[-1]
        slope = max((fitted[hi] - fitted[below]) / (hi - below), (fitted[hi] - fitted[lo]) / (hi - lo))
        return fitted[hi] + slope * (size - hi)
    anchor = sizes[0] if i == 0 else sizes[-1]  # outside them: the prior's shape from the nearest
    return fitted[anchor] * float(prior(size)) / max(1e-12, float(prior(anchor)))


def convex_minorant(cost: Any, lo: int, hi: int) -> Any:
    """The greatest convex function below ``cost`` on the sizes lo..hi (the lower hull of its points), as a cost
    function (``cost`` itself outside them)."""
    if hi <= lo + 1:
        return cost
    ys = [cost(n) for n in range(lo, hi + 1)]
    hull: list[int] = []  # indices of the lower hull's vertices
    for i, y in enumerate(ys):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (b - a) * (y - ys[a]) - (ys[b] - ys[a]) * (i - a) <= 0:  # b lies on or above the line from a to i
                hull.pop()
            else:
                break
        hull.append(i)
    values = list(ys)
    for a, b in zip(hull, hull[1:]):
        for i in range(a + 1, b):
            values[i] = ys[a] + (ys[b] - ys[a]) * (i - a) / (b - a)

    def convex(n: int) -> float:
        return values[n - lo] if lo <= n <= hi else float(cost(n))

    return convex


def isotonic(values: dict[int, float], weights: dict[int, float] | None = None) -> dict[int, float]:
    """The non-decreasing (in key order) weighted least-squares fit of ``values``, by pooling adjacent violators."""
    keys = sorted(values)
    blocks: list[list[float]] = []  # [mean, weight, number of keys]
    for key in keys:
        blocks.append([values[key], weights.get(key, 1.0) if weights else 1.0, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, weight, n = blocks.pop()
            prev = blocks[-1]
            prev[0] = (prev[0] * prev[1] + mean * weight) / (prev[1] + weight)
            prev[1] += weight
            prev[2] += n
    fitted = [mean for mean, _, n in blocks for _ in range(int(n))]
    return dict(zip(keys, fitted))


class BatchPassCosts:
    """The target pass's seconds by tokens fed, one :class:`PassCosts` curve per number of sequences in the pass.

    A pass's cost is not a function of its tokens alone: on the bfloat16 CPU step each sequence attends on its own
    (measured, SmolLM2-135M, 300 cached tokens each: 8 sequences x 1 token 100 ms, 1 x 5 tokens 52 ms, 8 x 5 tokens
    130 ms), so a curve learned over every pass mixes "8 tokens of 8 sequences" with "8 tokens of 2" and prices the
    draft tokens of a full batch at the slope of a small one. A batch's curve is used once it has a measurement;
    before, the curve of the nearest measured batch size. The live curves share one drift (``live_drift``): the
    machine is one, so a slowdown that the passes of the batch sizes served now show also prices the batch sizes
    not served for a while.

    Anchored (``anchor``: curves measured in turn at a few batch sizes): every batch size up to the largest anchored
    takes its shape from them (linear in the number of sequences between two anchored sizes), all share one drift
    (the median ratio of the last live passes to their shapes), and larger batches are learned live as before."""

    SEQS = (*range(1, 9), 12, 16, 24, 32, 48, 64, 96, 128, 256)

    def __init__(self, prior: Any) -> None:
        self.prior = prior
        self.curves: dict[int, PassCosts] = {}  # live, per batch bucket
        self.live_drift = Drift()  # shared by every batch size's live curve: the machine is one
        self._empty = PassCosts(prior)
        self.anchors: dict[int, PassCosts] = {}  # anchored, per batch bucket up to the largest measured
        self._ratios: deque[float] = deque(maxlen=DRIFT_WINDOW)

    def anchor(self, curves: dict[int, dict[int, float]]) -> None:
        """Take the shapes from ``curves`` (per number of sequences: seconds by tokens fed, measured in turn)."""
        measured: dict[int, PassCosts] = {}
        for seqs, seconds in curves.items():
            c = PassCosts(self.prior)
            c.anchor(seconds)
            if c.anchored:
                measured[self.bucket(seqs)] = c
        if not measured:
            return
        self.anchors = dict(measured)
        known = sorted(measured)
        for b in (b for b in self.SEQS if known[0] < b < known[-1] and b not in measured):
            i = bisect.bisect_left(known, b)
            lo, hi = measured[known[i - 1]], measured[known[i]]
            w = (b - known[i - 1]) / (known[i] - known[i - 1])
            sizes = sorted(set(lo.anchored) | set(hi.anchored))
            blend = PassCosts(self.prior)
            blend.anchor({n: lo.shape(n) + (hi.shape(n) - lo.shape(n)) * w for n in sizes})
            self.anchors[b] = blend
        self._ratios.clear()
        self.curves = {b: c for b, c in self.curves.items() if b > known[-1]}

    @property
    def drift(self) -> float:
        return statistics.median(self._ratios) if self._ratios else 1.0

    @classmethod
    def bucket(cls, seqs: int) -> int:
        return _seqs_bucket(max(1, seqs))

    def curve(self, seqs: int = 1) -> PassCosts:
        b = self.bucket(seqs)
        if self.anchors:
            top = max(self.anchors)
            if b <= top:
                return self.anchors.get(b) or self.anchors[min(self.anchors, key=lambda m: (abs(m - b), m))]
            return self.curves.get(b) or self.anchors[top]
        own = self.curves.get(b)
        if own is not None:
            return own
        if not self.curves:
            return self._empty
        return self.curves[min(self.curves, key=lambda m: (abs(m - b), m))]

    def observe(self, tokens: int, seconds: float, seqs: int = 1) -> None:
        b = self.bucket(seqs)
        if self.anchors and b <= max(self.anchors):
            if tokens <= 0 or seconds <= 0 or not math.isfinite(seconds):
                return
            self._ratios.append(seconds / max(1e-12, self.curve(seqs).shape(tokens)))
            drift = statistics.median(self._ratios)
            for c in self.anchors.values():  # one drift for every anchored batch size
                c.set_drift(drift)
            return
        b = self.bucket(seqs)
        if b not in self.curves:
            self.curves[b] = PassCosts(self.prior, drift=self.live_drift)
        self.curves[b].observe(tokens, seconds)

    def cost(self, tokens: int, seqs: int = 1) -> float:
        return self.curve(seqs).cost(tokens)

    def measured(self, tokens: int, seqs: int = 1, within: int | None = None) -> bool:
        """Whether a pass of about ``tokens`` tokens of ``seqs`` sequences has been timed (``within``: among the last
        so many passes of its batch size), on its batch size's own curve or an anchored one, not only estimated from
        another batch size's; True before anything is timed (every cost is then the prior's, consistent with
        itself)."""
        if self._nothing_to_time(seqs):
            return True
        own = self.curves.get(self.bucket(seqs))
        return own is not None and own.measured(tokens, within)

    def fresh(self, tokens: int, seqs: int = 1) -> bool:
        """Whether a pass of about ``tokens`` tokens of ``seqs`` sequences need not be timed again on purpose
        (:meth:`PassCosts.fresh` on its batch size's own curve); True where :meth:`measured` is for another reason."""
        if self._nothing_to_time(seqs):
            return True
        own = self.curves.get(self.bucket(seqs))
        return own is not None and own.fresh(tokens)

    def _nothing_to_time(self, seqs: int) -> bool:
        """Whether no pass of ``seqs`` sequences needs timing: its batch size is anchored, or nothing is timed yet."""
        return bool(self.anchors and self.bucket(seqs) <= max(self.anchors)) or not (self.curves or self.anchors)

    @property
    def scale(self) -> float | None:
        """Seconds per prior unit (of one sequence's passes where measured): what a draft's prior is scaled by."""
        for b in sorted(self.curves | self.anchors):
            c = self.anchors.get(b) or self.curves[b]
            if c.scale is not None:
                return c.scale
        return None

    @property
    def seconds(self) -> dict[int, dict[int, float]]:
        """Per number of sequences: the per-size estimates."""
        return {b: dict(c.seconds) for b, c in sorted(self.curves.items())}

    @property
    def fitted(self) -> dict[int, dict[int, float]]:
        return {b: dict(c.fitted) for b, c in sorted(self.curves.items())}


@functools.lru_cache(maxsize=1024)
def _seqs_bucket(seqs: int) -> int:
    """The nearest of BatchPassCosts.SEQS to ``seqs`` (the lower one on a tie); asked several times a step."""
    return min(BatchPassCosts.SEQS, key=lambda b: (abs(b - seqs), b))


@dataclass(frozen=True)
class CostPrior:
    """Relative pass costs (a one-token target pass = 1) before measurements: from `trtspec tune`'s c and v, or
    the defaults of this CPU."""

    target_slope: float = DEFAULT_TARGET_SLOPE  # per extra token fed
    draft_c: float = DEFAULT_DRAFT_C  # one draft round of one row
    draft_row: float = DEFAULT_DRAFT_ROW  # per extra row of a draft round
    verify_c: float = DEFAULT_VERIFY_C  # verifying one row: the head and the acceptance routine
    verify_row: float = DEFAULT_VERIFY_ROW  # per extra row verified

    @classmethod
    def from_costs(cls, c: float, v_at_k: dict[int, float] | None = None) -> CostPrior:
        """From measured c and v (v[K]: verifying K + 1 tokens over one target step)."""
        slope = DEFAULT_TARGET_SLOPE
        if v_at_k:
            k = max(v_at_k)
            slope = max(0.0, (float(v_at_k[k]) - 1.0) / k) if k > 0 else slope
        return cls(target_slope=slope, draft_c=float(c), draft_row=float(c) * 0.2)

    def target(self, tokens: int) -> float:
        return 1.0 + self.target_slope * max(0, tokens - 1)

    def draft(self, rows: int) -> float:
        if rows <= 0:
            return 0.0  # no round
        return self.draft_c + self.draft_row * (rows - 1)

    def verify(self, rows: int) -> float:
        if rows <= 0:
            return 0.0
        return self.verify_c + self.verify_row * (rows - 1)
