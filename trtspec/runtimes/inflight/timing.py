"""Forward passes timed exactly as the in-flight engine runs them (the fused step where the model has one, the slot KV
cache), and the calibration of the adaptive policy's cost curves on them at an engine's start (``calibrate``). The
cost ratios built on them (c, v, the thread choice) are in trtspec.runtimes.torch.costs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from trtspec.runtimes.inflight.drafter import draft_pass
from trtspec.runtimes.inflight.head import lazy_head
from trtspec.runtimes.inflight.kv_pool import KVGeometry, SlotKVPool, device_of, synchronize
from trtspec.runtimes.inflight.llama_step import step_of
from trtspec.runtimes.inflight.packed import packed_forward, prepare_model
from trtspec.speculative.rules import MAX_DRAFT_LEN


class TimedPasses:
    """Timed forward passes of one model exactly as the in-flight engine runs them (trtspec.runtimes.inflight.packed:
    the fused step where the model has one, the slot KV cache), after ``context`` cached random tokens."""

    def __init__(self, model: Any, context: int, fast_step: bool = True, slots: int = 1) -> None:
        self.model = prepare_model(model)
        self.fast = step_of(self.model) if fast_step else None
        self.context = context
        self.vocab = int(model.config.vocab_size)
        self.device = device = device_of(self.model)
        self.pool = SlotKVPool(KVGeometry.of(self.model), slots, context + MAX_DRAFT_LEN + 2, device=device)
        prompt = torch.randint(0, self.vocab, (context,)).tolist()
        packed_forward(self.model, self.pool, [(0, 0, prompt)], [context - 1], fast=self.fast)
        lm_head = getattr(self.model, "lm_head", None)
        self.head = lazy_head(self.model)
        if self.head is not None and self.fast is not None and self.fast.head is not None and self.head is lm_head:
            self.head = self.fast.head  # what the engine applies

    def forward(self, n_new: int, body_only: bool = False) -> Callable[[], float]:
        """One pass of ``n_new`` tokens after the context (the body alone, or logits at every new position)."""
        new = torch.randint(0, self.vocab, (n_new,)).tolist()
        keep = list(range(n_new))

        def once() -> float:
            synchronize(self.device)
            t0 = time.perf_counter()
            packed_forward(self.model, self.pool, [(0, self.context, new)], keep, hidden=body_only, fast=self.fast)
            synchronize(self.device)
            return time.perf_counter() - t0  # the slot keeps ``context`` tokens: the next pass overwrites these

        return once

    def draft_round(self, seqs: int = 1) -> Callable[[], float]:
        """One greedy draft round of ``seqs`` sequences, as the engine's draft model runs it (its argmax included)."""
        return _engine_pass(self, seqs, 1, False, last_only=True)

    def head_once(self, rows: int = 1) -> Callable[[], float]:
        """One timed multiply of the lazily applied head over ``rows`` rows."""
        param = next(self.model.parameters())
        hidden = torch.randn(rows, self.model.config.hidden_size, dtype=param.dtype, device=self.device)
        head = self.head
        assert head is not None  # timed only when the head is applied lazily

        def once() -> float:
            synchronize(self.device)
            t0 = time.perf_counter()
            head(hidden)
            synchronize(self.device)
            return time.perf_counter() - t0

        return once


def medians(fns: dict[str, Callable[[], float]], reps: int) -> dict[str, float]:
    """Median time of each function; they alternate so that background load hits them alike; round 0 warms up."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    with torch.inference_mode():
        for rep in range(reps + 1):
            for name, fn in fns.items():
                t = fn()
                if rep:
                    times[name].append(t)
    return {name: statistics.median(t) for name, t in times.items()}


# What ``calibrate`` times by default: tokens per sequence (a K-token verification feeds K + 1), batch sizes.
CALIBRATION_TOKENS = (1, 2, 3, 4, 5, 7, 9)
CALIBRATION_BATCH_TOKENS = (1, 2, 3, 5)
CALIBRATION_BATCHES = (1, 2, 4, 8)


def calibration_batches(max_batch: int) -> set[int]:
    """The batch sizes ``calibrate`` measures for an engine of ``max_batch`` sequences."""
    return {b for b in CALIBRATION_BATCHES if b <= max(1, max_batch)}


def _engine_pass(passes: TimedPasses, b: int, n: int, hidden: bool, last_only: bool = False) -> Callable[[], float]:
    """One timed pass of ``b`` sequences feeding ``n`` tokens each after the context, as the in-flight engine runs
    it: every fed row kept and the body alone (``hidden``, the engine's lazy head; else logits on every row), or one
    row per sequence, as a greedy draft round (``last_only``)."""
    feeds = [(s, passes.context, torch.randint(0, passes.vocab, (n,)).tolist()) for s in range(b)]
    keep = [s * n + n - 1 for s in range(b)] if last_only else list(range(b * n))

    def once() -> float:
        synchronize(passes.device)
        t0 = time.perf_counter()
        if last_only:  # as the draft model's greedy round (its tokens' argmax included)
            draft_pass(passes.model, passes.pool, feeds, keep, passes.fast, plain=True)
        else:
            packed_forward(passes.model, passes.pool, feeds, keep, hidden=hidden, fast=passes.fast)
        synchronize(passes.device)
        return time.perf_counter() - t0

    return once


def calibrate(
    policy: Any,
    target: Any,
    draft: Any | None = None,
    *,
    max_batch: int = 1,
    context: int = 256,
    reps: int = 7,
    fast_step: bool = True,
) -> dict[str, Any]:
    """Anchor ``policy``'s (trtspec.speculative.adaptive.AdaptivePolicy) cost curves on a controlled measurement
    through the engine's own passes: the target's pass (the body, as the engine's lazy head leaves it) over 1-9
    tokens of one sequence, and over 1-5 tokens each of 2, 4 and 8 sequences up to ``max_batch``; the draft's round
    of as many rows; every size timed in turn, ``reps`` times, after ``context`` cached tokens. Live passes then only
    move the curves' scale (trtspec.speculative.pass_costs), so that one slow stretch of a noisy machine does not
    reshape what the policy chooses. Returns what it measured (seconds). 4.4 s at batch 1 and 20 s up to 8 on
    SmolLM2-135M bfloat16 on a 2-core CPU (measured); milliseconds on the tests' tiny models."""
    batches = sorted(calibration_batches(max_batch))
    top = max(batches)
    for model in (target, draft) if draft is not None else (target,):
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit:
            context = max(1, min(context, int(limit) - MAX_DRAFT_LEN - 4))
    t = TimedPasses(target, context, fast_step, slots=top)
    d = TimedPasses(draft, context, fast_step, slots=top) if draft is not None else None
    hidden = t.head is not None
    with torch.inference_mode():
        for passes in (t, d) if d is not None else (t,):
            for slot in range(1, top):  # every slot holds the context, as slot 0 does
                ids = torch.randint(0, passes.vocab, (context,)).tolist()
                packed_forward(passes.model, passes.pool, [(slot, 0, ids)], [context - 1], fast=passes.fast)
    fns: dict[str, Callable[[], float]] = {}
    for b in batches:
        for n in CALIBRATION_TOKENS if b == 1 else CALIBRATION_BATCH_TOKENS:
            fns[f"t{b}x{n}"] = _engine_pass(t, b, n, hidden)
        if d is not None:
            fns[f"d{b}"] = d.draft_round(b)
    med = medians(fns, reps)
    target_s: dict[int, dict[int, float]] = {}
    for name, s in med.items():
        if name.startswith("t"):
            b, n = (int(x) for x in name[1:].split("x"))
            target_s.setdefault(b, {})[b * n] = s
    draft_s = {int(name[1:]): s for name, s in med.items() if name.startswith("d")}
    policy.anchor(target_s, draft_s or None)
    return {"target": target_s, "draft": draft_s}
