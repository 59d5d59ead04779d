"""The torch side of ``speedup``: the target's reference greedy answers, each drafter's match lengths on them, and
the decoder's measured time per K. Shared by `trtspec tune`, the distill report and the benchmarks.

Reference answers are decoded one request at a time through ``ModelState`` exactly as ``SpeculativeDecoder`` decodes
target-only (same forward passes, so the same greedy tokens). A model draft's match lengths come from its own KV
cache: at each answer position it proposes greedily until the first miss (at most ``k_max``), then the cache is
cropped back; models may sit on GPUs (inputs move to them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trtspec.runtimes.torch.cache import GrowableCache
from trtspec.speculative.drafters.hybrid import HYBRID_MIN_MATCH, HYBRID_MODEL_K
from trtspec.speculative.replay import Answers
from trtspec.speculative.speedup import MatchProfile


@dataclass
class Reference:
    """One held-out request: its prompt, the target's greedy answer and the max_tokens it was decoded with."""

    prompt: list[int]
    answer: list[int]
    max_tokens: int


def reference_answers(
    target: Any, prompts: Sequence[Sequence[int]], max_tokens: int, eos_ids: Sequence[int], pad_id: int = 0
) -> list[Reference]:
    """The target's greedy answer to each prompt, one request at a time (as the in-process decoder runs them)."""
    from trtspec.runtimes.torch.answers import answer_batch

    out = []
    for p in prompts:
        sample = answer_batch(target, [list(p)], max_tokens, 1, eos_ids, pad_id)[0]
        out.append(Reference(list(p), sample.answer.tolist(), max_tokens))
    return out


def _device(model: Any) -> torch.device:
    return model.get_input_embeddings().weight.device


@torch.inference_mode()
def model_match_lengths(draft: Any, ref: Reference, k_max: int) -> list[int]:
    """At each answer position, how many greedy proposals of ``draft`` match the answer (<= k_max)."""
    dev = _device(draft)
    cache = GrowableCache()
    ctx = ref.prompt + ref.answer
    start = len(ref.prompt)
    if start > 1:
        draft(input_ids=torch.tensor([ref.prompt[:-1]], device=dev), cache=cache, use_cache=True, logits_to_keep=1)
    n = len(ref.answer)
    lengths = []
    for p in range(n):
        committed = ctx[start - 1 + p]  # the last prompt token, then each answer token in turn
        logits = draft(
            input_ids=torch.tensor([[committed]], device=dev), cache=cache, use_cache=True, logits_to_keep=1
        ).logits[0, -1]
        tok = int(logits.argmax())
        matched = fed = 0
        while matched < k_max and p + matched < n and tok == ref.answer[p + matched]:
            matched += 1
            if matched == k_max or p + matched >= n:
                break
            logits = draft(
                input_ids=torch.tensor([[tok]], device=dev), cache=cache, use_cache=True, logits_to_keep=1
            ).logits[0, -1]
            fed += 1
            tok = int(logits.argmax())
        if fed:
            cache.crop(-fed)
        lengths.append(matched)
    return lengths


def drafter_match_lengths(drafter: Any, ref: Reference, k_max: int) -> tuple[list[int], list[int], list[int]]:
    """(match lengths, suffix match lengths, proposal lengths) of a token drafter (``drafters.Drafter``) at each
    answer position."""
    ctx = ref.prompt + ref.answer
    start = len(ref.prompt)
    lengths, matches, sizes = [], [], []
    for p in range(len(ref.answer)):
        proposal = drafter.propose(ctx[: start + p], k_max)
        matched = 0
        for tok, want in zip(proposal.tokens, ref.answer[p:]):
            if tok != want:
                break
            matched += 1
        lengths.append(matched)
        matches.append(proposal.match_len)
        sizes.append(min(k_max, len(proposal.tokens)))
    return lengths, matches, sizes


def model_profile(draft: Any, refs: Sequence[Reference], k_max: int) -> MatchProfile:
    """A model draft's MatchProfile on the reference answers."""
    return MatchProfile(k_max, [model_match_lengths(draft, r, k_max) for r in refs], [r.max_tokens for r in refs])


def drafter_profile(drafter: Any, refs: Sequence[Reference], k_max: int) -> tuple[MatchProfile, list[list[int]]]:
    """A token drafter's MatchProfile (draft cost 0: a few array lookups; at most as many proposals per position as
    its proposal there has: where prompt lookup finds a short continuation, the decoder's step verifies only that)
    and its suffix match lengths."""
    rows = [drafter_match_lengths(drafter, r, k_max) for r in refs]
    lengths = [r[0] for r in rows]
    zero = [[0.0] * len(r) for r in lengths]
    profile = MatchProfile(k_max, lengths, [r.max_tokens for r in refs], draft_cost=zero, k_limit=[r[2] for r in rows])
    return profile, [r[1] for r in rows]


def hybrid_profile(
    ngram: MatchProfile,
    matches: Sequence[Sequence[int]],
    model: MatchProfile,
    *,
    c: float,
    min_match: int = HYBRID_MIN_MATCH,
    model_k: int = HYBRID_MODEL_K,
) -> MatchProfile:
    """The hybrid rule on the same answers (by default the hybrid drafter's own ``min_match`` and ``model_k``): where
    the n-gram matched >= ``min_match`` tokens, its proposals (cost ~0); elsewhere the model's, at most ``model_k`` of
    them at c each. (The model's catch-up on tokens emitted by n-gram steps rides on its next step's first forward, a
    few tokens instead of one: not counted.)"""
    lengths, costs, limits = [], [], []
    for r, (ng_row, m_row, mod_row) in enumerate(zip(ngram.lengths, matches, model.lengths)):
        use_ngram = [m >= min_match for m in m_row]
        ng_limits = ngram.k_limit[r] if ngram.k_limit is not None else [ngram.k_max] * len(ng_row)
        lengths.append([ln if u else lm for ln, lm, u in zip(ng_row, mod_row, use_ngram)])
        costs.append([0.0 if u else c for u in use_ngram])
        limits.append([lim if u else model_k for lim, u in zip(ng_limits, use_ngram)])
    return MatchProfile(
        min(ngram.k_max, model.k_max), lengths, list(ngram.max_tokens), draft_cost=costs, k_limit=limits
    )


def replay_answers(draft: Any, pool: Any, refs: Sequence[Reference], k_max: int) -> Answers:
    """What the adaptive drafter's replay (trtspec.speculative.replay) needs of the reference answers: the n-gram
    drafter's profile over ``pool`` (None: prompt lookup only), the draft model's (``draft`` None: none)."""
    from trtspec.speculative.drafters.ngram import NgramDrafter

    ngram, matches = drafter_profile(NgramDrafter(pool), refs, k_max)
    model = model_profile(draft, refs, k_max) if draft is not None else None
    return Answers(ngram, matches, model, [len(r.prompt) for r in refs])


def time_decoder(decoder: Any, prompts: Sequence[Sequence[int]], max_tokens: int, k: int) -> dict[str, Any]:
    """Wall time, counts and the decoder's own timers (draft, target) of ``decoder.generate`` over the prompts one at
    a time at draft length K (0: target-only)."""
    seconds = draft_s = target_s = 0.0
    tokens = steps = drafted = accepted = 0  # SpecStats' (TensorRT-LLM's) total_draft_tokens, ..._accepted_...
    outputs = []
    for p in prompts:
        t0 = time.perf_counter()
        r = decoder.generate([list(p)], max_tokens, num_draft_tokens=k if k else None, use_draft=bool(k))[0]
        seconds += time.perf_counter() - t0
        tokens += len(r.token_ids)
        steps += r.stats.target_steps
        drafted += r.stats.total_draft_tokens
        accepted += r.stats.total_accepted_draft_tokens
        draft_s += r.stats.draft_s
        target_s += r.stats.target_s
        outputs.append(r.token_ids)
    return {
        "seconds": seconds,
        "tokens": tokens,
        "steps": steps,
        "total_draft_tokens": drafted,
        "total_accepted_draft_tokens": accepted,
        "draft_s": draft_s,
        "target_s": target_s,
        "outputs": outputs,
    }


def loop_costs(run: dict[str, float], base: dict[str, float]) -> tuple[float | None, float | None]:
    """(c, v) as the decoder's own timers saw them at one K: a draft step and a verification, each over a
    target-only step of the same prompts (None where the decoder reports no timers)."""
    t_step = base["target_s"] / base["steps"] if base.get("steps") and base.get("target_s") else None
    if not t_step:
        return None, None
    drafted = run.get("total_draft_tokens")
    c = run["draft_s"] / drafted / t_step if drafted and run.get("draft_s") else None
    v = run["target_s"] / run["steps"] / t_step if run.get("steps") and run.get("target_s") else None
    return c, v
