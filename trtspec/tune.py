"""`trtspec tune`: measure the drafter on a prompt set and choose K (1..MAX_DRAFT_LEN) and the route threshold.

In process: the target's greedy answers to the prompts are the references; the drafter's match length at every
answer position gives its per-position acceptance, and every K is simulated step by step with the step costs c and
v measured on these models (``speculative.speedup``); the best predicted K's are then run through the decoder and
timed against target-only, and the choice is the K with the best measured speedup (the best predicted one where
nothing was measured, e.g. with ``costs`` given). Through a served endpoint (``--url``) every K is timed against
``num_draft_tokens`` 0 on the same server, and acceptance comes from the responses' statistics.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trtspec.errors import GenerationError
from trtspec.prompts import Prompt
from trtspec.spec import BuildSpec
from trtspec.speculative.drafters import DrafterKind
from trtspec.speculative.rules import MAX_DRAFT_LEN, check_max_draft_len
from trtspec.speculative.speedup import (
    MatchProfile,
    Simulated,
    StepCosts,
    best_k,
    per_token_acceptance,
    route_threshold,
    simulate,
    sweep,
)

K_RANGE = tuple(range(1, MAX_DRAFT_LEN + 1))


@dataclass
class TuneResult:
    """Per K: predicted and (where run) measured speedup; the choice."""

    source: str  # "in-process" or the endpoint URL
    drafter: str
    rows: list[dict[str, Any]]
    per_position: list[float]
    costs: dict[str, Any] | None
    k: int
    route_threshold: int
    current: dict[str, int]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "drafter": self.drafter,
            "k": self.k,
            "route_threshold": self.route_threshold,
            "current": self.current,
            "per_position": [round(x, 4) for x in self.per_position],
            "costs": self.costs,
            "rows": self.rows,
            "notes": self.notes,
        }


def default_prompts(n: int) -> list[Prompt]:
    """Held-out prompts of the shipped distillation set (the ones `trtspec distill` never trains on)."""
    from trtspec.prompts import held_out_prompts

    return held_out_prompts(n)


def workload_prompts(n: int) -> list[Prompt]:
    """``n`` conversations of the workload set (trtspec.prompts.workloads), taken in turn from every category, so
    that any n >= 6 covers multi-turn chat, code, summarization, retrieval-grounded QA, translation and math."""
    from trtspec.prompts import workloads

    sets = list(workloads().values())
    out: list[Prompt] = []
    for i in range(max(len(s) for s in sets)):
        out += [s[i] for s in sets if i < len(s)]
    return out[:n]


def profile_for(spec: BuildSpec, draft: Any, pool: Any, refs: Sequence[Any], k_max: int, c: float) -> MatchProfile:
    """The spec's drafter (``speculative.drafter``: model, ngram or hybrid; ``pool`` its n-gram pool, None: prompt
    lookup only) on the reference answers. (The adaptive drafter has no fixed rule: it is replayed, see
    ``simulate_drafter``.)"""
    from trtspec.runtimes.torch.profiling import drafter_profile, hybrid_profile, model_profile

    kind = spec.speculative.drafter
    if kind is DrafterKind.MODEL:
        return model_profile(draft, refs, k_max)
    from trtspec.speculative.drafters.ngram import NgramDrafter

    ngram, matches = drafter_profile(NgramDrafter(pool), refs, k_max)
    if kind is DrafterKind.NGRAM:
        return ngram
    return hybrid_profile(ngram, matches, model_profile(draft, refs, k_max), c=c)


def simulate_drafter(
    spec: BuildSpec, draft: Any, pool: Any, refs: Sequence[Any], ks: Sequence[int], costs: StepCosts
) -> tuple[MatchProfile, list[Simulated], list[str]]:
    """Every K of the spec's drafter on the reference answers: the exact simulation of a fixed rule, or for the
    adaptive drafter its policy replayed (trtspec.speculative.replay: a fresh policy per K, learning the given costs
    as a server learns its own), and the least-cost bound of any per-step choice at the largest K (a note)."""
    if spec.speculative.drafter is not DrafterKind.ADAPTIVE:
        profile = profile_for(spec, draft, pool, refs, ks[-1], costs.c)
        return profile, sweep(profile, costs, ks), []
    from trtspec.runtimes.torch.profiling import replay_answers
    from trtspec.speculative.adaptive import AdaptivePolicy
    from trtspec.speculative.replay import least_cost, replay

    answers = replay_answers(draft, pool, refs, ks[-1])
    sims = [replay(AdaptivePolicy(), answers, costs, k) for k in ks]
    bound = least_cost(answers, costs, ks[-1])
    fixed = max(simulate(answers.ngram, k, costs).speedup for k in ks)
    notes = [
        f"adaptive replayed on the target's answers; the least-cost decode with every match known in advance "
        f"(K <= {ks[-1]}) would be {bound.speedup:.2f}x, the best fixed n-gram K {fixed:.2f}x"
    ]
    return answers.ngram, sims, notes


def _row(sim: Simulated, costs: StepCosts) -> dict[str, Any]:
    row = sim.to_dict()
    row["v"] = round(costs.v(sim.k, sim.tokens_per_step), 4)
    return row


def tune_in_process(
    spec: BuildSpec,
    prompts: Sequence[Prompt],
    *,
    ks: Sequence[int] = K_RANGE,
    max_tokens: int = 64,
    measure_top: int = 4,
    costs: StepCosts | None = None,
    progress: Any = None,
) -> TuneResult:
    """Tune on the spec's models loaded by the torch runtime (see module docstring)."""
    from trtspec.prompts import encode
    from trtspec.runtimes.torch.costs import measure_step_costs
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder
    from trtspec.runtimes.torch.profiling import Reference, loop_costs, time_decoder
    from trtspec.runtimes.torch.session import TorchSession

    def say(text: str) -> None:
        if progress is not None:
            progress(text)

    ks = sorted(set(ks))
    if not ks:
        raise GenerationError("no K values to tune", hint="e.g. --k-max 8")
    for k in (ks[0], ks[-1]):
        check_max_draft_len(k, "K")
    session = TorchSession.from_spec(spec, load_draft=True)  # the draft's costs are measured for every drafter
    target, draft, pool = session.target, session.draft, session.decoder.ngram_pool
    ids = [encode(session.tokenizer, p) for p in prompts]
    dec = SpeculativeDecoder(
        target,
        draft,
        max_draft_len=ks[-1],
        eos_ids=session.decoder.eos_ids,
        pad_id=session.decoder.pad_id,
        drafter=spec.speculative.drafter,
        ngram_pool=pool,
    )
    say("target-only reference answers")
    base = time_decoder(dec, ids, max_tokens, 0)
    refs = [Reference(list(p), list(o), max_tokens) for p, o in zip(ids, base["outputs"])]
    notes = []
    if costs is None:
        say("step costs (c, v)")
        context = int(statistics.mean(len(p) for p in ids)) + max_tokens // 2
        costs = measure_step_costs(target, draft, context, ks[-1], int(statistics.mean(len(p) for p in ids)))
        if spec.runtime.value != "torch":
            notes.append(
                f"costs were measured on this machine's torch runtime, not on {spec.runtime.value}'s "
                "GPUs: pass --costs FILE measured there, or --url a served endpoint"
            )
    say(f"per-position acceptance ({spec.speculative.drafter.value})")
    profile, sims, replay_notes = simulate_drafter(spec, draft, pool, refs, ks, costs)
    notes += replay_notes
    rows = [_row(s, costs) for s in sims]
    measured: dict[int, float] = {}
    in_loop: dict[int, tuple[float | None, float | None]] = {}
    if costs.measured and measure_top:
        top = sorted(sims, key=lambda s: -s.speedup)[:measure_top]
        for s in sorted(top, key=lambda s: s.k):
            say(f"measuring K={s.k}")
            run = time_decoder(dec, ids, max_tokens, s.k)
            if run["outputs"] != base["outputs"]:
                raise GenerationError(
                    f"K={s.k}: speculative output differs from target-only",
                    hint="this is a bug in the decoder; report it",
                )
            measured[s.k] = base["seconds"] / run["seconds"] if run["seconds"] else 0.0
            in_loop[s.k] = loop_costs(run, base)
    for row in rows:
        row["measured_speedup"] = round(measured[row["k"]], 4) if row["k"] in measured else None
        c_loop, v_loop = in_loop.get(row["k"], (None, None))
        row["c_in_loop"] = round(c_loop, 4) if c_loop is not None else None
        row["v_in_loop"] = round(v_loop, 4) if v_loop is not None else None
    k = best_k(sims, measured)
    chosen = next(s for s in sims if s.k == k)
    threshold = route_threshold(chosen, costs, spec.engine.max_seq_len)
    return TuneResult(
        "in-process",
        spec.speculative.drafter.value,
        rows,
        profile.per_position(),
        costs.to_dict(),
        k,
        threshold,
        _current(spec),
        notes,
    )


def tune_url(
    spec: BuildSpec,
    url: str,
    prompts: Sequence[str],
    *,
    ks: Sequence[int] = K_RANGE,
    max_tokens: int = 64,
    chat: bool = True,
) -> TuneResult:
    """Time every K on a served endpoint against ``num_draft_tokens`` 0; acceptance from the response stats."""
    import time

    from trtspec.serving.client import TritonLLMClient

    rows, measured = [], {}
    notes: list[str] = []
    with TritonLLMClient(url) as client:
        client.check_ready()
        if client.contract == "llmapi":
            raise GenerationError(
                "the trtllm-llmapi model fixes K at load time (model.yaml); it cannot be tuned per request",
                hint="tune in process (omit --url), or restart with another K",
            )

        def run(k: int) -> tuple[float, int, int]:
            t0 = time.perf_counter()
            drafted = accepted = 0
            for p in prompts:
                r = client.generate(p, max_tokens, apply_chat_template=chat, num_draft_tokens=k)
                drafted += int(r.stats.get("total_draft_tokens", 0))
                accepted += int(r.stats.get("total_accepted_draft_tokens", 0))
            return time.perf_counter() - t0, drafted, accepted

        # The server refuses a K above its max_draft_len (the one K rule): measure up to it.
        bound = client.max_draft_len()
        served_ks = sorted(k for k in set(ks) if bound is None or k <= bound)
        if not served_ks:
            raise GenerationError(
                f"no K in {sorted(set(ks))} is within the deployment's max_draft_len ({bound})",
                hint=f"tune K in 1..{bound} on this server",
            )
        if len(served_ks) < len(set(ks)):
            notes.append(
                f"K above the deployment's max_draft_len ({bound}) is refused by the server: measured "
                f"{served_ks[0]}..{served_ks[-1]}; a larger K needs a larger speculative.max_draft_len and a rebuild"
            )
        client.generate(prompts[0], 8, apply_chat_template=chat, num_draft_tokens=0)  # warm both paths
        base, _, _ = run(0)
        for k in served_ks:
            seconds, drafted, accepted = run(k)
            rate = accepted / drafted if drafted else 0.0
            measured[k] = base / seconds if seconds else 0.0
            rows.append(
                {
                    "k": k,
                    "acceptance_rate": round(rate, 4),
                    "a": round(per_token_acceptance(rate * k, k), 4),
                    "predicted_speedup": None,
                    "measured_speedup": round(measured[k], 4),
                }
            )
    k = max(measured, key=lambda x: (measured[x], -x))
    notes.append("through an endpoint only the measured speedup is known (no c, v): the route threshold is kept")
    return TuneResult(
        url, spec.speculative.drafter.value, rows, [], None, k, spec.speculative.route_threshold, _current(spec), notes
    )


def _current(spec: BuildSpec) -> dict[str, int]:
    return {"max_draft_len": spec.speculative.max_draft_len, "route_threshold": spec.speculative.route_threshold}
