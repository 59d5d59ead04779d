"""What a speculative step costs relative to one target step, measured on the models themselves (CPU or GPU).

c: one draft step (one token after ``context`` cached ones) / one target step. v: one verification / one target
step, where a verification is what SpeculativeDecoder does: with a lazily applied head
(trtspec.runtimes.inflight.head) the target's body over K + 1 tokens plus its head at ``tokens_per_step``
positions (one per emitted token); otherwise a full K + 1-token forward pass. With them, Leviathan et al.'s bound on
the speedup is S = tokens_per_step / (K c + v). Used by `trtspec distill`'s report and benchmarks/speculative_cpu.py.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from trtspec.runtimes.inflight.head import lazy_head
from trtspec.runtimes.torch.cache import GrowableCache


@torch.inference_mode()
def step_cost_ratios(
    target: Any, draft: Any, context: int, k: int, tokens_per_step: float, reps: int = 21
) -> tuple[float, float]:
    """(c, v): median draft step / target step, and median verification / target step, after ``context`` cached
    tokens; the forward passes alternate so that background load hits them alike. Verification is what the decoder
    does: with a lazily applied head (trtspec.runtimes.inflight.head) the body over K + 1 tokens plus the head at
    ``tokens_per_step`` positions (one per emitted token); otherwise a full K + 1-token forward pass."""
    head = lazy_head(target)

    def prepared(model, n_new, body_only=False):
        vocab = model.config.vocab_size
        cache = GrowableCache()
        model(input_ids=torch.randint(0, vocab, (1, context)), cache=cache, use_cache=True, logits_to_keep=1)
        new = torch.randint(0, vocab, (1, n_new))

        def once() -> float:
            t0 = time.perf_counter()
            if body_only:
                model.model(input_ids=new, cache=cache, use_cache=True)
            else:
                model(input_ids=new, cache=cache, use_cache=True, logits_to_keep=n_new)
            cache.crop(-n_new)
            return time.perf_counter() - t0

        return once

    hidden = torch.randn(1, target.config.hidden_size, dtype=next(target.parameters()).dtype)

    def head_once() -> float:
        assert head is not None  # timed only when the head is applied lazily
        t0 = time.perf_counter()
        head(hidden)
        return time.perf_counter() - t0

    fns = [prepared(target, 1), prepared(draft, 1)]
    fns += [prepared(target, k + 1, body_only=True), head_once] if head is not None else [prepared(target, k + 1)]
    times: list[list[float]] = [[] for _ in fns]
    for rep in range(reps + 1):
        for i, fn in enumerate(fns):
            t = fn()
            if rep:  # the first round warms up
                times[i].append(t)
    med = [statistics.median(t) for t in times]
    t1, d1 = med[0], med[1]
    verify = med[2] + tokens_per_step * med[3] if head is not None else med[2]
    return d1 / t1, verify / t1


def speedup_bound(tokens_per_step: float, k: int, c: float, v: float) -> float:
    """Expected tokens per target step over the cost of one speculative step, in target steps."""
    return tokens_per_step / (k * c + v)


@torch.inference_mode()
def measure_step_costs(
    target: Any, draft: Any | None, context: int, k_max: int, prompt_len: int, reps: int = 15
) -> Any:
    """``speedup.StepCosts`` measured on the models: the target's body over k + 1 tokens for k = 0..k_max and its head
    at one position (the decoder's lazy head; without one, full forwards and ``head`` 0), a draft step, and both
    prefills of a ``prompt_len``-token prompt, all after ``context`` cached tokens and relative to one target step."""
    from trtspec.speculative.speedup import StepCosts

    head = lazy_head(target)
    vocab = target.config.vocab_size

    def cached(model):
        cache = GrowableCache()
        model(input_ids=torch.randint(0, vocab, (1, context)), cache=cache, use_cache=True, logits_to_keep=1)
        return cache

    def forward(model, cache, n_new, body_only):
        new = torch.randint(0, vocab, (1, n_new))

        def once() -> float:
            t0 = time.perf_counter()
            if body_only:
                model.model(input_ids=new, cache=cache, use_cache=True)
            else:
                model(input_ids=new, cache=cache, use_cache=True, logits_to_keep=1 if n_new == 1 else n_new)
            cache.crop(-n_new)
            return time.perf_counter() - t0

        return once

    def prefill(model):
        ids = torch.randint(0, vocab, (1, max(1, prompt_len - 1)))

        def once() -> float:
            t0 = time.perf_counter()
            model(input_ids=ids, cache=GrowableCache(), use_cache=True, logits_to_keep=1)
            return time.perf_counter() - t0

        return once

    hidden = torch.randn(1, target.config.hidden_size, dtype=next(target.parameters()).dtype)

    def head_once() -> float:
        assert head is not None  # timed only when the head is applied lazily
        t0 = time.perf_counter()
        head(hidden)
        return time.perf_counter() - t0

    t_cache = cached(target)
    fns: dict[str, Any] = {"t1": forward(target, t_cache, 1, False), "tp": prefill(target)}
    for k in range(0, k_max + 1):
        fns[f"b{k}"] = forward(target, t_cache, k + 1, head is not None)
    if head is not None:
        fns["head"] = head_once
    if draft is not None:
        fns["d1"] = forward(draft, cached(draft), 1, False)
        fns["dp"] = prefill(draft)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rep in range(reps + 1):
        for name, fn in fns.items():
            t = fn()
            if rep:
                times[name].append(t)
    med = {name: statistics.median(t) for name, t in times.items()}
    t1 = med["t1"]
    return StepCosts(
        c=med.get("d1", 0.0) / t1,
        body={k: med[f"b{k}"] / t1 for k in range(0, k_max + 1)},
        head=med.get("head", 0.0) / t1,
        target_prefill=med["tp"] / t1,
        draft_prefill=med.get("dp", 0.0) / t1,
    )
