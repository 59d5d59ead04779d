"""What a speculative step costs relative to one target step, measured on the models themselves (CPU or GPU), through
the in-flight engine's own forward passes (slot KV cache, the fused Llama step where the model has one).

c: one draft step (one token after ``context`` cached ones) / one target step. v: one verification / one target
step, where a verification is what the engine does: with a lazily applied head
(trtspec.runtimes.inflight.head) the target's body over K + 1 tokens plus its head at ``tokens_per_step``
positions (one per emitted token); otherwise a full K + 1-token forward pass. With them, Leviathan et al.'s bound on
the speedup is S = tokens_per_step / (K c + v). Used by `trtspec distill`'s report and benchmarks/speculative_cpu.py.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from trtspec.runtimes.inflight.kv_pool import device_of, synchronize
from trtspec.runtimes.inflight.packed import packed_forward
from trtspec.runtimes.inflight.timing import TimedPasses, medians
from trtspec.speculative.pass_costs import isotonic

# Cores a served torch engine model of the BLS orchestration (tensorrt_llm_torch: the target's and the draft's, two
# processes beside the orchestrator) leaves to the rest of the server: Triton's frontends, the Python stubs' IPC and
# the response threads, and (on a developer's machine) the clients. Timed on an idle machine at start, one thread per
# core looked as fast as one thread and was chosen in 4 of 10 starts of the example's server on the 2-core VM, where
# through Triton it then decoded 37.6 tok/s against 51.6 with one thread at concurrency 1 and 214 against 237 at 8
# (target-only, two server starts each, alternated; benchmarks: README, "Serving with Triton"). That was when each
# kernel call opened its own OpenMP region; with a pass in one region (LlamaStep.one_region) the in-process model
# (tensorrt_llm_spec_torch, one process for both models) reserves none: through its OpenAI port on the same VM
# (benchmarks/peers_cpu.py, 2026-12-07 19:20 UTC) two threads decoded 87.9 tok/s against 60.8 with one at
# concurrency 1 and 331.7 against 206.6 at 8 (target-only; n-grams 146.8 / 82.6 and 230.9 / 139.5), the one-thread
# figures from the run at 16:55 UTC.
SERVED_RESERVE = 1
IN_PROCESS_RESERVE = 0


def fastest_threads(
    model: Any, context: int = 128, reps: int = 3, fast_step: bool = True, reserve: int = 0
) -> tuple[int, dict]:
    """The torch intra-op thread count (1 or one per core) under which ``model``'s decode step runs fastest on this
    machine now, and the median seconds of each: one-token passes after ``context`` cached tokens through the
    engine's own pass (passes of ``cpu_kernels.parallel_rows()`` tokens where the fused step calls trtspec's
    bfloat16 kernels one by one: smaller calls take one thread whatever the count), the counts alternating. Leaves
    torch set to the choice. Measured (bfloat16, SmolLM2-135M): on a 2-vCPU Intel Xeon VM one thread decoded 17.1 tok/s
    against 9.8 with two, idle, and the same busy, where a 2-core AMD EPYC decoded faster on both cores (see
    trtspec.threads).

    ``reserve``: cores left to other threads of this machine's serving (the served models pass
    :data:`SERVED_RESERVE`): the many-thread candidate is one per core less these, and with none left the choice is
    one thread, untimed."""
    import os

    cores = (os.cpu_count() or 1) - max(0, reserve)
    if device_of(model).type != "cpu":
        return torch.get_num_threads(), {}
    if cores <= 1:
        torch.set_num_threads(1)
        return 1, {}
    passes = TimedPasses(model, context, fast_step)
    # trtspec's kernels called one by one run a call of fewer rows than parallel_rows() on one thread whatever the
    # count (under a passive wait: trtspec.runtimes.inflight.cpu_kernels), so the counts differ from a pass of that
    # many tokens on; a whole pass in one OpenMP region (LlamaStep.one_region) takes every thread from one token on.
    from trtspec.runtimes.inflight import cpu_kernels

    kernels = passes.fast is not None and cpu_kernels.available()
    one_region = kernels and passes.fast is not None and passes.fast.whole_pass and passes.fast.one_region
    dtype = next(passes.model.parameters()).dtype
    step = passes.forward(max(1, cpu_kernels.parallel_rows(dtype)) if kernels and not one_region else 1)
    times: dict[int, list[float]] = {1: [], cores: []}
    with torch.inference_mode():
        for rep in range(reps + 1):
            for n in times:
                torch.set_num_threads(n)
                t = step()
                if rep:  # round 0 warms each count up
                    times[n].append(t)
    medians = {n: statistics.median(t) for n, t in times.items()}
    best = min(medians, key=lambda n: (medians[n], -n))
    torch.set_num_threads(best)
    return best, medians


def step_cost_ratios(
    target: Any,
    draft: Any,
    context: int,
    k: int,
    tokens_per_step: float,
    reps: int = 21,
    fast_step: bool = True,
) -> tuple[float, float]:
    """(c, v): median draft step / target step, and median verification / target step, after ``context`` cached
    tokens, through the engine's own passes (``fast_step``: the fused step where the model has one). Verification is
    what the engine does: with a lazily applied head (trtspec.runtimes.inflight.head) the body over K + 1 tokens
    plus the head at ``tokens_per_step`` positions (one per emitted token); otherwise a full K + 1-token pass."""
    t, d = TimedPasses(target, context, fast_step), TimedPasses(draft, context, fast_step)
    fns = {"t1": t.forward(1), "d1": d.draft_round()}
    if t.head is not None:
        fns |= {"body": t.forward(k + 1, body_only=True), "head": t.head_once()}
    else:
        fns["body"] = t.forward(k + 1)
    med = medians(fns, reps)
    verify = med["body"] + tokens_per_step * med["head"] if t.head is not None else med["body"]
    return med["d1"] / med["t1"], verify / med["t1"]


def speedup_bound(tokens_per_step: float, k: int, c: float, v: float) -> float:
    """Expected tokens per target step over the cost of one speculative step, in target steps."""
    return tokens_per_step / (k * c + v)


def measure_step_costs(
    target: Any,
    draft: Any | None,
    context: int,
    k_max: int,
    prompt_len: int,
    reps: int = 15,
    fast_step: bool = True,
) -> Any:
    """``speedup.StepCosts`` measured on the models through the engine's own passes: the target's body over k + 1
    tokens for k = 0..k_max and its head at one position (the engine's lazy head; without one, full passes and
    ``head`` 0), a draft step, and both prefills of a ``prompt_len``-token prompt, all after ``context`` cached
    tokens and relative to one target step."""
    from trtspec.speculative.speedup import StepCosts

    t = TimedPasses(target, context, fast_step, slots=2)
    lazy = t.head is not None

    def prefill(passes: TimedPasses) -> Callable[[], float]:
        ids = torch.randint(0, passes.vocab, (max(1, prompt_len - 1),)).tolist()

        def once() -> float:  # into the second slot, from scratch
            synchronize(passes.device)
            t0 = time.perf_counter()
            packed_forward(passes.model, passes.pool, [(1, 0, ids)], [len(ids) - 1], fast=passes.fast)
            synchronize(passes.device)
            return time.perf_counter() - t0

        return once

    fns: dict[str, Callable[[], float]] = {"t1": t.forward(1), "tp": prefill(t)}
    for k in range(0, k_max + 1):
        fns[f"b{k}"] = t.forward(k + 1, body_only=lazy)
    if lazy:
        fns["head"] = t.head_once()
        for n in range(2, k_max + 2):  # the head over a step's rows in one multiply (StepCosts.head_computed)
            fns[f"h{n}"] = t.head_once(n)
    if draft is not None:
        d = TimedPasses(draft, context, fast_step, slots=2)
        fns["d1"] = d.draft_round()
        fns["dp"] = prefill(d)
    med = medians(fns, reps)
    t1 = med["t1"]
    # A pass over more tokens does not cost less: the medians' order between sizes that cost about the same is noise,
    # and a replay on it took the noise for a fact (one run's 4-token pass at 0.750 of a step, its 3-token one at
    # 0.802: the fixed K 3 replayed 1.4 % above the adaptive policy, which prices passes on such a fit; on this fit
    # they were level). So the body is its non-decreasing (isotonic) fit.
    body = isotonic({k: med[f"b{k}"] / t1 for k in range(0, k_max + 1)})
    head_rows = isotonic({n: med["head" if n == 1 else f"h{n}"] / t1 for n in range(1, k_max + 2)}) if lazy else {}
    return StepCosts(
        head_rows=head_rows,
        flat_rows=int(getattr(t.head, "flat_rows", 0)) if lazy else 0,
        c=med.get("d1", 0.0) / t1,
        body=body,
        head=head_rows.get(1, 0.0),  # one row: the fit's, so that a step is priced on one measurement of it
        target_prefill=med["tp"] / t1,
        draft_prefill=med.get("dp", 0.0) / t1,
    )


def _batch_step(passes: TimedPasses, b: int, context: int, n: int, head: bool) -> Callable[[], float]:
    """One timed pass of ``b`` sequences feeding ``n`` tokens each after ``context`` (and the head on every row)."""
    feeds = [(s, context, torch.randint(0, passes.vocab, (n,)).tolist()) for s in range(b)]
    keep = list(range(b * n))
    apply = passes.head if head and passes.head is not None else None

    def once() -> float:
        synchronize(passes.device)
        t0 = time.perf_counter()
        states = packed_forward(passes.model, passes.pool, feeds, keep, hidden=apply is not None, fast=passes.fast)
        if apply is not None:
            apply(states)
        synchronize(passes.device)
        return time.perf_counter() - t0

    return once


def batch_step_costs(
    target: Any,
    draft: Any | None,
    context: int,
    batches: tuple[int, ...] = (1, 2, 4, 8),
    ks: tuple[int, ...] = (1, 2, 4),
    reps: int = 11,
    fast_step: bool = True,
) -> dict[int, dict[str, Any]]:
    """c and v as functions of the batch, through the engine's own passes: per batch size b, the seconds of a plain
    step (b sequences, one token each after ``context`` cached tokens, the head on each row), v[K] = a step in which
    every sequence verifies K + 1 tokens (head on every row) / the plain step, and c = one draft round of b rows /
    the plain step. (At b = 1 v counts the head on every row, an upper bound of what the engine's lazy head costs.)"""
    out: dict[int, dict[str, Any]] = {}
    for b in batches:
        t = TimedPasses(target, context, fast_step, slots=b)
        d = TimedPasses(draft, context, fast_step, slots=b) if draft is not None else None
        with torch.inference_mode():
            for passes in (t, d):
                if passes is None:
                    continue
                for slot in range(1, b):  # every slot holds ``context`` tokens, as slot 0 does
                    ids = torch.randint(0, passes.vocab, (context,)).tolist()
                    packed_forward(passes.model, passes.pool, [(slot, 0, ids)], [context - 1], fast=passes.fast)

        fns = {"t1": _batch_step(t, b, context, 1, True)} | {
            f"v{k}": _batch_step(t, b, context, k + 1, True) for k in ks
        }
        if d is not None:
            fns["d1"] = d.draft_round(b)
        med = medians(fns, reps)
        out[b] = {
            "step_s": med["t1"],
            "v": {k: med[f"v{k}"] / med["t1"] for k in ks},
            "c": med["d1"] / med["t1"] if d is not None else None,
        }
    return out
