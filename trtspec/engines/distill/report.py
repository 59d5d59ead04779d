"""How good a draft is for its target: held-out greedy acceptance at K, cost ratio c, and the speedup bound S.

Acceptance is measured by trtspec's own SpeculativeDecoder on held-out prompts. ``a`` in the bound is the per-token
acceptance probability; from the measured mean accepted tokens per target step m (with K proposals each step) it is the
a that solves a(1 - a^K) / (1 - a) = m, so that (1 - a^(K+1)) / (1 - a) is the measured tokens per step. The
accepted/proposed ratio that the decoder reports is lower than a (a rejection voids the rest of the window), and both
are reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch



@dataclass
class DraftReport:
    """The figures `trtspec distill` prints and writes to ``distill_report.json``."""

    k: int
    prompts: int
    acceptance_rate: float  # accepted / proposed, as SpeculativeDecoder reports it
    a: float  # per-token acceptance (geometric fit of accepted tokens per step)
    tokens_per_step: float
    c: float  # one draft step / one target step (single token, same context)
    v: float  # one verification as the decoder does it (K + 1 tokens, head where used) / one target step
    bound_s: float  # ((1 - a^(K+1)) / (1 - a)) / (K c + v)
    head_coverage: float  # fraction of the held-out answers' tokens that the draft's head can propose
    identical_greedy: bool  # speculative output == target-only output on every held-out prompt
    measured_speedup: float  # target-only time / speculative time on these prompts (a loaded machine skews it)

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def per_token_acceptance(mean_accepted: float, k: int) -> float:
    """The a whose geometric window of K gives ``mean_accepted`` accepted tokens per step (bisection)."""
    if mean_accepted <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        value = sum(mid ** i for i in range(1, k + 1))
        lo, hi = (mid, hi) if value < mean_accepted else (lo, mid)
    return (lo + hi) / 2


def measure(target: Any, draft: Any, prompts: Sequence[Sequence[int]], *, k: int, max_tokens: int,
            eos_ids: Sequence[int], pad_id: int = 0, head_tokens: torch.Tensor | None = None,
            costs: bool = True) -> DraftReport:
    """Held-out greedy acceptance and speed with trtspec's SpeculativeDecoder (one prompt at a time, as a chat user
    sees it) against target-only decoding of the same prompts, plus c, v and the bound (``costs=False``: NaN)."""
    from trtspec.engines.torch_runtime.costs import speedup_bound, step_cost_ratios
    from trtspec.engines.torch_runtime.decoder import SpeculativeDecoder

    dec = SpeculativeDecoder(target, draft, max_draft_len=k, eos_ids=eos_ids, pad_id=pad_id)
    proposed = accepted = 0
    outputs, base, spec_s, base_s = [], [], 0.0, 0.0
    for p in prompts:
        t0 = time.perf_counter()
        r = dec.generate([p], max_tokens, draft_len=k)[0]
        t1 = time.perf_counter()
        b = dec.generate([p], max_tokens, use_draft=False)[0]
        base_s += time.perf_counter() - t1
        spec_s += t1 - t0
        outputs.append(r.token_ids)
        base.append(b.token_ids)
        proposed += r.stats.total_draft_tokens
        accepted += r.stats.total_accepted_draft_tokens
    rate = accepted / proposed if proposed else 0.0
    # accepted / proposed * K: mean accepted per step with a full window (the last steps of an answer propose fewer)
    a = per_token_acceptance(rate * k, k)
    coverage = 1.0
    if head_tokens is not None:
        toks = torch.tensor([t for o in base for t in o], dtype=torch.long)
        coverage = float(torch.isin(toks, head_tokens).float().mean()) if len(toks) else 1.0
    context = int(statistics.mean(len(p) for p in prompts)) + max_tokens // 2
    tokens = float(k + 1) if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)
    c, v = step_cost_ratios(target, draft, context, k, tokens, reps=15) if costs else (float("nan"), float("nan"))
    return DraftReport(k, len(prompts), rate, a, tokens, c, v, speedup_bound(tokens, k, c, v), coverage,
                       outputs == base, base_s / spec_s if spec_s else 0.0)
