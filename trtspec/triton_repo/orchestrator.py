"""The draft-target loop of the ``tensorrt_llm_bls`` model, independent of Triton.

Each step asks the draft model for K tokens and the target model to verify them (``draft_input_ids``, optionally
``draft_logits``); the target returns the accepted draft tokens plus its own next token, exactly as TRT-LLM's
``draft_tokens_external`` mode does (upstream: ``tensorrt_llm_bls/1/lib/decode.py``, ``_spec_generate``). Unlike the
upstream loop this one streams each step's tokens, runs any number of sequences concurrently, and routes requests
asking fewer than ``route_threshold`` tokens (or K = 0) straight to the target. Output is lossless: the target decides
every token, so greedy output equals target-only greedy output. Accepted draft tokens are counted by prefix match of
the target's output against the draft (TensorRT-LLM's ``examples/prompt_lookup/run_dtm_pld.py``).

Drafters (``speculative.drafter``): ``model`` asks the draft engine; ``ngram`` proposes in this process (prompt lookup
plus the shipped n-gram pool, trtspec.speculative.drafters.ngram) and never calls the draft engine; ``hybrid`` takes the
n-grams on a confident match, else the draft engine at a smaller K; ``adaptive`` chooses per request and step between
the n-grams, the draft engine and no draft, and K (trtspec.speculative.adaptive), learning the costs from the timings
of its own engine calls. Either way the proposal reaches the target as
``draft_input_ids``, so the engines need nothing new; an n-gram step sends no draft logits (the proposal is a point
mass, which the target's acceptance handles exactly).

The engines are reached through ``EngineClient``: BLS requests inside Triton, or in-process engines in tests and
benchmarks. This path serves runtime ``trtllm-engine`` (the engines are C++ backend models); the torch runtime
runs the same rules inside one in-flight engine instead (trtspec.runtimes.inflight).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from trtspec.errors import GenerationError
from trtspec.request_fields import SAMPLING_FIELDS
from trtspec.runtimes.inflight.contract import RowRequest
from trtspec.speculative.rules import SpecStats, accepted_prefix, check_draft_len
from trtspec.speculative.words import hits_stop_word
from trtspec.triton_repo.names import DRAFT, TARGET
from trtspec.validation import validate_max_tokens, validate_prompt_tokens


class EngineClient(Protocol):
    """One generation request to an engine model (tensorrt_llm or tensorrt_llm_draft)."""

    def generate(self, model: str, row: RowRequest) -> AsyncIterator[tuple[list[int], Any]]:
        """Yield (new tokens, their generation logits or None) per engine response."""
        ...


@dataclass(frozen=True)
class Deployment:
    """The orchestrator's fixed settings (from the repository's config): what the engines were built for."""

    target_model: str = TARGET
    draft_model: str = DRAFT
    max_draft_len: int = 4  # the deployment's K: what requests get when they do not say, and the most they may ask
    engine_max_draft_len: int = 4  # the most draft tokens the target engine accepts per step (its --max_draft_len)
    route_threshold: int = 0
    use_draft_logits: bool = False  # the default for requests that do not say
    draft_logits_available: bool = False  # the engines were built with --gather_generation_logits
    max_seq_len: int = 1 << 30
    max_input_len: int = 1 << 30  # the longest sequence one engine request may carry (TensorRT-LLM's maxInputLen)
    max_prompt_len: int = 1 << 30  # the longest prompt a request may carry (the spec's engine.max_input_len)
    log_probs: bool = False  # serves return_log_probs (the in-process model; the BLS orchestrator does not)
    exact_penalties: bool = True  # the engines apply penalties and min_tokens per draft position (torch; not TRT-LLM)


@dataclass(frozen=True)
class Plan:
    """How one request is served: K draft tokens per step (0: the target alone), with draft logits or not."""

    k: int
    use_draft_logits: bool

    @property
    def routed(self) -> bool:
        return self.k == 0


def plan_request(row: RowRequest, deployment: Deployment) -> Plan:
    """Validate one request against the deployment and decide K; a request the engines cannot serve is refused
    here, with one clear error, before any engine sees it."""
    if not row.tokens:
        raise GenerationError("the prompt is empty", hint="send at least one token")
    validate_max_tokens(row.max_new)
    if row.return_log_probs and not deployment.log_probs:
        raise GenerationError(
            "return_log_probs is not supported by the BLS orchestration (orchestration bls)",
            hint="leave return_log_probs out, or serve with orchestration in_process (runtime torch)",
        )
    if (row.sampling.penalized or row.sampling.min_tokens) and not deployment.exact_penalties:
        name = next(f.name for f in SAMPLING_FIELDS if f.history and getattr(row.sampling, f.name) != f.default)
        raise GenerationError(
            f"{name} is not supported by the BLS orchestration over TensorRT-LLM engines: their penalty kernel "
            "counts the tokens before a step for every draft position in it, so verified drafts would not be the "
            "target's own output",
            hint=f"leave {name} out, or serve with runtime torch",
        )
    # The prompt in tokens, as preprocessing counts it (trtspec.validation: the same rule at every door).
    validate_prompt_tokens(len(row.tokens), row.max_new, deployment.max_prompt_len, deployment.max_seq_len)
    longest = len(row.tokens) + row.max_new - 1  # the last step re-sends everything but the last token
    if longest > deployment.max_input_len:
        raise GenerationError(
            f"prompt ({len(row.tokens)} tokens) + max_tokens ({row.max_new}) needs engine inputs of {longest} tokens, "
            f"above the engines' maximum input length ({deployment.max_input_len})",
            hint="shorten the prompt or lower max_tokens (the engines re-read the whole sequence every step)",
        )
    # A request's K: the one rule, bounded by the deployment's max_draft_len (and the engine's, were it smaller).
    bound = min(deployment.max_draft_len, deployment.engine_max_draft_len)
    k = deployment.max_draft_len if row.num_draft_tokens is None else check_draft_len(row.num_draft_tokens, bound)
    use_logits = deployment.use_draft_logits if row.use_draft_logits is None else row.use_draft_logits
    if use_logits and not deployment.draft_logits_available and row.use_draft_logits:
        raise GenerationError(
            "use_draft_logits needs engines built with --gather_generation_logits, and these were not",
            hint="send use_draft_logits false, or rebuild with speculative.use_draft_logits: true",
        )
    if row.max_new < deployment.route_threshold:
        k = 0
    return Plan(k, use_logits and deployment.draft_logits_available and not row.sampling.greedy)


def _step_row(
    row: RowRequest,
    tokens: list[int],
    max_new: int,
    base_seed: int | None,
    step: int,
    role: int,
    produced: int = 0,
    **changes: Any,
) -> RowRequest:
    """One engine request of a step, after ``produced`` tokens. Every engine request seeds its own generator: the
    seed varies per step and role so that steps draw independent numbers. min_tokens counts from the request's
    start: an engine request counts from its own input, so it gets what is left."""
    seed = None if base_seed is None else (base_seed * 1_000_003 + step * 2 + role) % (1 << 63)
    sampling = dataclasses.replace(row.sampling, seed=seed, min_tokens=max(0, row.sampling.min_tokens - produced))
    return dataclasses.replace(
        row,
        tokens=tokens,
        max_new=max_new,
        sampling=sampling,
        draft=None,
        draft_logits=None,
        exclude_input=True,
        num_draft_tokens=None,
        use_draft_logits=None,
        **changes,
    )


async def generate(
    row: RowRequest, engines: EngineClient, deployment: Deployment, stats: SpecStats | None = None, drafter: Any = None
) -> AsyncIterator[list[int]]:
    """Yield the tokens each step commits (end_id excluded); statistics accumulate in ``stats``. ``drafter``: None
    (the draft engine proposes K every step) or the kind's ``LocalDrafter`` (trtspec.speculative.drafters)."""
    stats = stats if stats is not None else SpecStats()
    stats.num_input_tokens = len(row.tokens)
    plan = plan_request(row, deployment)
    if plan.routed:
        stats.routed_to_target = True
        stats.target_steps = 1
        async for tokens, _ in engines.generate(
            deployment.target_model,
            dataclasses.replace(row, exclude_input=True, num_draft_tokens=None, use_draft_logits=None),
        ):
            stats.note_tokens(len(tokens))
            if tokens:
                yield tokens
        return

    greedy = row.sampling.greedy
    base_seed = row.sampling.seed if row.sampling.seed is not None else (None if greedy else random.getrandbits(62))
    state = drafter.new_state(row.sampling) if drafter is not None else None
    try:
        # aclosing: a caller that leaves early closes the steps at once, their engine calls' iterators included.
        async with contextlib.aclosing(_steps(row, engines, deployment, stats, drafter, state, plan, base_seed)) as s:
            async for tokens in s:
                yield tokens
    finally:
        if drafter is not None:
            drafter.finish(state)  # it no longer shares the target's passes with the other requests


async def _steps(
    row: RowRequest,
    engines: EngineClient,
    deployment: Deployment,
    stats: SpecStats,
    drafter: Any,
    state: Any,
    plan: Plan,
    base_seed: int | None,
) -> AsyncGenerator[list[int], None]:
    """The draft-target steps of one request (``generate``), each step's committed tokens."""
    seq = list(row.tokens)
    produced = 0
    step = 0
    while produced < row.max_new:
        k_eff = min(plan.k, row.max_new - produced - 1)
        draft: list[int] = []
        draft_logits = None
        local: list[int] | None = []
        k_model = 0
        if k_eff > 0:
            local, k_model = (None, k_eff) if drafter is None else drafter.plan(state, seq, k_eff)
        t_draft = time.perf_counter()
        if local is not None:
            draft = list(local)  # may be empty (no match, or chosen not to): the target steps alone
        elif k_model > 0:
            async for tokens, logits in engines.generate(
                deployment.draft_model,
                _step_row(
                    row, seq, k_model, base_seed, step, 0, produced, stream=False, return_logits=plan.use_draft_logits
                ),
            ):
                draft += tokens
                if logits is not None:
                    draft_logits = logits if draft_logits is None else _concat(draft_logits, logits)
        t_target = time.perf_counter()
        # Nothing proposed: the drafter may step aside for a stretch of plain tokens in one streamed call.
        run = drafter.plain_run(state) if drafter is not None and k_eff > 0 and not draft else 1
        n_out = min(run, row.max_new - produced) if not draft else len(draft) + 1
        stretch = n_out > 1 and not draft
        new: list[int] = []
        stopped = False
        async for tokens, _ in engines.generate(
            deployment.target_model,
            dataclasses.replace(
                _step_row(row, seq, n_out, base_seed, step, 1, produced, stream=stretch, return_logits=False),
                draft=draft or None,
                draft_logits=draft_logits if plan.use_draft_logits and draft and local is None else None,
            ),
        ):
            if not stretch:
                new += tokens
                continue
            tokens = tokens[: row.max_new - produced]  # a stretch's tokens go out as the target streams them
            new += tokens
            seq += tokens
            produced += len(tokens)
            stats.note_tokens(len(tokens))
            if tokens:
                yield tokens
            stopped = produced >= row.sampling.min_tokens and hits_stop_word(seq[len(row.tokens) :], row.stop_words)
            if stopped:
                break
        step += 1
        if stretch:  # only a drafter stretches
            for _ in new:
                stats.note_step(0, 0)
            drafter.verdict(state, 0, 0, time.perf_counter() - t_target, plain_tokens=len(new))
            if stopped or len(new) < n_out:  # a stop word, or the target stopped (end_id) before the stretch's end
                return
            continue
        accepted = accepted_prefix(draft, new)
        stats.note_step(len(draft), accepted)
        if drafter is not None:
            now = time.perf_counter()
            drafter.verdict(state, len(draft), accepted, now - t_target, t_target - t_draft if local is None else 0.0)
        # The target returns accepted drafts + its own token; fewer, all from the draft, means it stopped (end_id).
        ended = len(new) <= len(draft) and new == draft[: len(new)]
        new = new[: row.max_new - produced]
        seq += new
        produced += len(new)
        stats.note_tokens(len(new))
        if new:
            yield new
        stopped = produced >= row.sampling.min_tokens and hits_stop_word(seq[len(row.tokens) :], row.stop_words)
        if ended or not new or stopped:
            return


def _concat(a: Any, b: Any) -> Any:
    import numpy as np

    return np.concatenate([np.asarray(a), np.asarray(b)], axis=0)
