"""How good a draft is for its target: held-out greedy acceptance, per-position acceptance, cost ratios, the bound,
the exact-simulation prediction and the measured speedup; the same for the n-gram and hybrid drafters.

Measured with the shared code of `trtspec tune` (``speculative.speedup`` and ``profiling``): the target's greedy
answers to held-out prompts are the references; each drafter's match length at every answer position gives its
per-position acceptance and, simulated step by step as the decoder runs, tokens per target step and the predicted
speedup for any K. On a CPU the in-process decoder also runs both ways on the same prompts (identical greedy output,
measured speedup). ``a`` is the per-token acceptance whose geometric window gives the measured accepted tokens per
step; the accepted/proposed ratio is lower (a rejection voids the rest of the window), and both are reported.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

K_MAX = 8  # per-position acceptance and simulations cover K = 1..K_MAX


@dataclass
class DraftReport:
    """The figures `trtspec distill` prints and writes to ``distill_report.json``."""

    k: int
    prompts: int
    acceptance_rate: float  # accepted / proposed at K (decoder on a CPU, else the exact simulation)
    a: float  # per-token acceptance (geometric fit of accepted tokens per step)
    tokens_per_step: float
    c: float  # one draft step / one target step (single token, same context)
    v: float  # one verification as the decoder does it (K + 1 tokens, head where used) / one target step
    bound_s: float  # ((1 - a^(K+1)) / (1 - a)) / (K c + v)
    predicted_speedup: float  # exact simulation of the decoder's steps with the measured costs
    head_coverage: float  # fraction of the held-out answers' tokens that the draft's head can propose
    identical_greedy: bool | None  # speculative output == target-only output on every held-out prompt (None: not run)
    measured_speedup: float | None  # target-only time / speculative time on these prompts (None: not run)
    per_position: list[float] = field(default_factory=list)  # alpha_1..alpha_K_MAX
    full_head_agreement: float | None = None  # positions where the plain full head's argmax is the frequent head's
    drafters: dict[str, Any] = field(default_factory=dict)  # ngram / prompt_lookup / hybrid: tokens per step, speedup
    costs: dict[str, Any] | None = None  # the measured StepCosts (body per K, head, prefills), for `trtspec tune`

    def to_dict(self) -> dict[str, Any]:
        def r(v: Any) -> Any:
            if isinstance(v, float):
                return None if math.isnan(v) else round(v, 4)
            if isinstance(v, list):
                return [r(x) for x in v]
            if isinstance(v, dict):
                return {k: r(x) for k, x in v.items()}
            return v

        return {k: r(v) for k, v in asdict(self).items()}


@torch.inference_mode()
def full_head_agreement(draft: Any, refs: Sequence[Any]) -> float | None:
    """On the reference answers (teacher-forced): the fraction of positions where the standard checkpoint's full head
    (trained rows, zero rows elsewhere) picks the frequent head's token, i.e. its best frequent logit is above 0."""
    if not hasattr(draft, "subset_logits"):
        return None
    agree = total = 0
    dev = next(draft.parameters()).device
    for ref in refs:
        ids = torch.tensor([ref.prompt + ref.answer], device=dev)
        hidden = draft.model(input_ids=ids, use_cache=False).last_hidden_state[0, len(ref.prompt) - 1 : -1]
        best = draft.subset_logits(hidden).max(-1).values
        agree += int((best > 0).sum())
        total += int(best.numel())
    return agree / total if total else None


def measure(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    *,
    k: int,
    max_tokens: int,
    eos_ids: Sequence[int],
    pad_id: int = 0,
    head_tokens: torch.Tensor | None = None,
    costs: bool = True,
    pool: Any | None = None,
    run_decoder: bool | None = None,
) -> DraftReport:
    """Held-out figures of ``draft`` (and of the n-gram drafter over ``pool``) against ``target`` on ``prompts``.

    ``costs=False`` skips timing (c, v, bound and predictions NaN); ``run_decoder`` (default: on a CPU) runs the
    in-process decoder both ways for the identical-output check and the measured speedup."""
    from trtspec.runtimes.torch.costs import measure_step_costs
    from trtspec.runtimes.torch.profiling import Reference, model_profile, reference_answers, time_decoder
    from trtspec.speculative.speedup import StepCosts, leviathan_bound, simulate

    cpu = next(target.parameters()).device.type == "cpu" and next(draft.parameters()).device.type == "cpu"
    run_decoder = cpu if run_decoder is None else run_decoder
    rate, identical, measured = None, None, None
    if run_decoder:
        from trtspec.runtimes.torch.decoder import SpeculativeDecoder

        dec = SpeculativeDecoder(target, draft, max_draft_len=k, eos_ids=eos_ids, pad_id=pad_id)
        base = time_decoder(dec, prompts, max_tokens, 0)
        spec = time_decoder(dec, prompts, max_tokens, k)
        refs = [Reference(list(p), list(o), max_tokens) for p, o in zip(prompts, base["outputs"])]
        identical = spec["outputs"] == base["outputs"]
        measured = base["seconds"] / spec["seconds"] if spec["seconds"] else 0.0
        drafted = spec["total_draft_tokens"]
        rate = spec["total_accepted_draft_tokens"] / drafted if drafted else 0.0
    else:
        refs = reference_answers(target, prompts, max_tokens, eos_ids, pad_id)
    k_max = max(k, K_MAX)
    profile = model_profile(draft, refs, k_max)
    context = int(statistics.mean(len(p) for p in prompts)) + max_tokens // 2
    prompt_len = int(statistics.mean(len(p) for p in prompts))
    nan = float("nan")
    step_costs = (
        measure_step_costs(target, draft, context, k_max, prompt_len)
        if costs and cpu
        else StepCosts(nan, {i: nan for i in range(k_max + 1)}, nan, measured=False)
    )
    sim = simulate(profile, k, step_costs)
    v = step_costs.v(k, sim.tokens_per_step)
    coverage = 1.0
    if head_tokens is not None:
        toks = torch.tensor([t for r in refs for t in r.answer], dtype=torch.long)
        coverage = float(torch.isin(toks, head_tokens.cpu()).float().mean()) if len(toks) else 1.0
    report = DraftReport(
        k=k,
        prompts=len(prompts),
        acceptance_rate=sim.acceptance_rate if rate is None else rate,
        a=sim.a,
        tokens_per_step=sim.tokens_per_step,
        c=step_costs.c,
        v=v,
        bound_s=leviathan_bound(sim.a, k, step_costs.c, v),
        predicted_speedup=sim.speedup,
        head_coverage=coverage,
        identical_greedy=identical,
        measured_speedup=measured,
        per_position=profile.per_position(),
        full_head_agreement=full_head_agreement(draft, refs),
        costs=step_costs.to_dict() if step_costs.measured else None,
    )
    if pool is not None:
        report.drafters = drafter_figures(pool, profile, refs, step_costs, k)
    return report


def drafter_figures(pool: Any, model: Any, refs: Sequence[Any], costs: Any, k: int) -> dict[str, Any]:
    """Tokens per target step and predicted speedup of prompt lookup, n-gram (prompt + pool) and the hybrid."""
    from trtspec.runtimes.torch.profiling import drafter_profile, hybrid_profile
    from trtspec.speculative.drafters.hybrid import HYBRID_MIN_MATCH, HYBRID_MODEL_K
    from trtspec.speculative.drafters.ngram import NgramDrafter
    from trtspec.speculative.speedup import simulate

    out: dict[str, Any] = {}
    ngram_profile, matches = drafter_profile(NgramDrafter(pool), refs, model.k_max)
    lookup_profile, _ = drafter_profile(NgramDrafter(None), refs, model.k_max)
    hybrid = hybrid_profile(ngram_profile, matches, model, c=costs.c)
    for name, prof in (("prompt_lookup", lookup_profile), ("ngram", ngram_profile), ("hybrid", hybrid)):
        sim = simulate(prof, k, costs)
        out[name] = {
            "k": k,
            "tokens_per_step": sim.tokens_per_step,
            "acceptance_rate": sim.acceptance_rate,
            "predicted_speedup": sim.speedup,
            "per_position": prof.per_position()[:k],
        }
    out["hybrid"].update(min_match=HYBRID_MIN_MATCH, model_k=HYBRID_MODEL_K)
    out["pool_tokens"] = pool.n_tokens
    return out
