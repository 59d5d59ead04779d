"""The draft-target loop of the ``tensorrt_llm_bls`` model, independent of Triton.

Each step asks the draft model for K tokens and the target model to verify them (``draft_input_ids``, optionally
``draft_logits``); the target returns the accepted draft tokens plus its own next token, exactly as TRT-LLM's
``draft_tokens_external`` mode does (upstream: ``tensorrt_llm_bls/1/lib/decode.py``, ``_spec_generate``). Unlike the
upstream loop this one streams each step's tokens, runs any number of sequences concurrently, and routes requests
asking fewer than ``route_threshold`` tokens (or K = 0) straight to the target. Output is lossless: the target decides
every token, so greedy output equals target-only greedy output.

The engines are reached through ``EngineClient``: BLS requests inside Triton, or in-process engines in tests and
benchmarks.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trtspec.engines.inflight.words import hits_stop_word

MAX_DRAFT_LEN = 16


@dataclass(frozen=True)
class StepParams:
    """Sampling and stopping settings passed to both engines on every step."""

    end_id: int | None = None
    pad_id: int = 0
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_words: Sequence[Sequence[int]] = ()
    bad_words: Sequence[Sequence[int]] = ()


class EngineClient(Protocol):
    """One generation request to an engine model (tensorrt_llm or tensorrt_llm_draft)."""

    def generate(self, model: str, tokens: list[int], max_new: int, params: StepParams, *,
                 draft: list[int] | None = None, draft_logits: Any = None, stream: bool = False,
                 want_logits: bool = False) -> AsyncIterator[tuple[list[int], Any]]:
        """Yield (new tokens, their generation logits or None) per engine response."""
        ...


@dataclass
class GenRequest:
    """One sequence to generate."""

    prompt: list[int]
    max_tokens: int
    params: StepParams = field(default_factory=StepParams)
    num_draft_tokens: int | None = None  # None: the deployment's K
    use_draft_logits: bool = False
    stream: bool = False


@dataclass
class GenStats:
    """Per-request statistics, reported in the response tensors."""

    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_steps: int = 0
    output_tokens: int = 0
    routed_to_target: bool = False
    arrival_ns: int = field(default_factory=time.time_ns)
    first_token_ns: int = 0
    last_token_ns: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    def note_tokens(self, n: int) -> None:
        if n:
            now = time.time_ns()
            self.first_token_ns = self.first_token_ns or now
            self.last_token_ns = now
            self.output_tokens += n


@dataclass(frozen=True)
class Deployment:
    """The orchestrator's fixed settings (from the repository's config)."""

    target_model: str = "tensorrt_llm"
    draft_model: str = "tensorrt_llm_draft"
    max_draft_len: int = 4
    route_threshold: int = 0
    use_draft_logits: bool = False


def _step_params(p: StepParams, base_seed: int | None, step: int, role: int) -> StepParams:
    """Every engine request seeds its own generator: vary the seed per step so steps draw independent numbers."""
    if base_seed is None:
        return p
    seed = (base_seed * 1_000_003 + step * 2 + role) % (1 << 63)
    return StepParams(p.end_id, p.pad_id, p.temperature, p.top_k, p.top_p, seed, p.stop_words, p.bad_words)


async def generate(req: GenRequest, engines: EngineClient, deployment: Deployment,
                   stats: GenStats | None = None) -> AsyncIterator[list[int]]:
    """Yield the tokens each step commits (end_id excluded); statistics accumulate in ``stats``."""
    stats = stats if stats is not None else GenStats()
    k = deployment.max_draft_len if req.num_draft_tokens is None else req.num_draft_tokens
    k = max(0, min(int(k), MAX_DRAFT_LEN))
    if k == 0 or req.max_tokens < deployment.route_threshold:
        stats.routed_to_target = True
        stats.target_steps = 1
        async for tokens, _ in engines.generate(deployment.target_model, list(req.prompt), req.max_tokens,
                                                req.params, stream=req.stream):
            stats.note_tokens(len(tokens))
            if tokens:
                yield tokens
        return

    greedy = req.params.temperature <= 0.0
    base_seed = req.params.seed if req.params.seed is not None else (None if greedy else random.getrandbits(62))
    use_logits = req.use_draft_logits and not greedy
    seq = list(req.prompt)
    produced = 0
    step = 0
    while produced < req.max_tokens:
        k_eff = min(k, req.max_tokens - produced - 1)
        draft: list[int] = []
        draft_logits = None
        if k_eff > 0:
            async for tokens, logits in engines.generate(deployment.draft_model, seq, k_eff,
                                                         _step_params(req.params, base_seed, step, 0),
                                                         want_logits=use_logits):
                draft += tokens
                if logits is not None:
                    draft_logits = logits if draft_logits is None else _concat(draft_logits, logits)
        new: list[int] = []
        async for tokens, _ in engines.generate(deployment.target_model, seq, len(draft) + 1,
                                                _step_params(req.params, base_seed, step, 1),
                                                draft=draft, draft_logits=draft_logits if use_logits else None):
            new += tokens
        step += 1
        stats.target_steps += 1
        stats.draft_tokens += len(draft)
        # The target returns accepted drafts + its own token; fewer, all from the draft, means it stopped (end_id).
        ended = len(new) <= len(draft) and new == draft[: len(new)]
        accepted = len(new) - (0 if ended else 1)
        if ended and len(new) < len(draft) and req.params.end_id is not None and draft[len(new)] == req.params.end_id:
            accepted += 1
        stats.accepted_tokens += max(0, accepted)
        new = new[: req.max_tokens - produced]
        seq += new
        produced += len(new)
        stats.note_tokens(len(new))
        if new:
            yield new
        if ended or not new or hits_stop_word(seq[len(req.prompt):], req.params.stop_words):
            return


def _concat(a: Any, b: Any) -> Any:
    import numpy as np

    return np.concatenate([np.asarray(a), np.asarray(b)], axis=0)
