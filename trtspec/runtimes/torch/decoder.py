"""Draft-target speculative decoding over Hugging Face causal LMs, in process.

A thin front of the in-flight engine (trtspec.runtimes.inflight), run in the caller's thread: the same draft-target
loop, acceptance rules and KV caches serve ``trtspec generate``, the benchmarks and the torch runtime's Triton models.
Each step the drafter (``drafter``: the draft model, n-grams, or the hybrid of both) proposes up to K tokens (the
draft from its own KV cache), the target scores all of them (plus the bonus position) in one forward pass, the longest
acceptable prefix is emitted with the target's own next token, and both caches are cut back to the committed length
(never recomputed). Greedy output equals target-only greedy output; sampled output
follows the target's distribution (see ``acceptance``). ``use_draft=False`` runs target-only decoding through the
same code path.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.errors import GenerationError, IncompatibleModelsError
from trtspec.runtimes.inflight.drafter import engine_drafter
from trtspec.runtimes.inflight.engine import InflightEngine
from trtspec.runtimes.inflight.head import lazy_head
from trtspec.runtimes.inflight.jobs import Job
from trtspec.speculative.adaptive import AdaptivePolicy
from trtspec.speculative.drafters import DrafterKind
from trtspec.speculative.drafters.registry import entry as drafter_entry
from trtspec.speculative.rules import SamplingParams, SpecStats, TokenLogprob, check_draft_len, check_max_draft_len

MIN_CAPACITY = 512  # KV capacity per sequence the engine is sized for at least (grown on demand)


@dataclass
class GenerationResult:
    token_ids: list[int]
    finish_reason: str  # "stop" (a stop token was emitted) or "length" (max_tokens reached)
    stats: SpecStats = field(default_factory=SpecStats)
    # Per token: its log-probability under the target and the top alternatives (``logprobs`` of generate/stream).
    logprobs: list[TokenLogprob] | None = None


def _vocab(model: Any) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _context(model: Any) -> int:
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


class SpeculativeDecoder:
    """Draft-target decoding with a target and an optional draft (both eval-mode HF causal LMs on one device)."""

    def __init__(
        self,
        target: Any,
        draft: Any | None = None,
        *,
        max_draft_len: int = 4,
        eos_ids: Sequence[int] = (),
        pad_id: int = 0,
        drafter: DrafterKind | str = DrafterKind.MODEL,
        ngram_pool: Any = None,
        policy: Any = None,
        fast_step: bool = True,
    ) -> None:
        """``drafter`` (``speculative.drafter``, trtspec.speculative.drafters.registry): model (the draft proposes),
        ngram (prompt lookup + ``ngram_pool``, an ``NgramPool`` or its file; no draft model needed), hybrid (n-grams
        on a confident match, else the draft) or adaptive (per sequence and step, either or none, and K; ``policy``:
        its trtspec.speculative.adaptive.AdaptivePolicy, kept across calls). ``fast_step``: Llama-family models run
        their fused step (trtspec.runtimes.inflight.llama_step); False: the transformers module tree (the reference
        the benchmarks compare with)."""
        self.fast_step = fast_step
        self.drafter = DrafterKind(drafter)
        runs_model = drafter_entry(self.drafter).runs_draft_model
        if self.drafter is DrafterKind.HYBRID and draft is None:
            raise GenerationError(f"drafter {self.drafter.value} needs a draft model", hint="load the draft too")
        if not runs_model:
            draft = None  # proposals are the n-grams'; a draft model is not used
        if isinstance(ngram_pool, (str, Path)):
            from trtspec.speculative.drafters.ngram import NgramPool

            ngram_pool = NgramPool.load(Path(ngram_pool))
        self.ngram_pool = ngram_pool
        # One policy for every engine this decoder builds, so what it learned survives a larger batch.
        self.policy = policy if policy is not None else AdaptivePolicy()
        check_max_draft_len(max_draft_len)
        if draft is not None and _vocab(draft) != _vocab(target):
            raise IncompatibleModelsError(
                f"draft vocabulary ({_vocab(draft)}) differs from the target's ({_vocab(target)})",
                hint="draft and target must share one tokenizer; `trtspec check` compares them",
            )
        self.target = target
        self.draft = draft
        self.max_draft_len = max_draft_len
        self.eos_ids = tuple(eos_ids)
        self.pad_id = pad_id
        self.context = min(_context(target), _context(draft) if draft is not None else 1 << 30)
        # The target's lm_head applied only where logits are used; None: full logits (other model classes).
        self.head = lazy_head(target)
        self._engines: dict[bool, InflightEngine] = {}

    @property
    def speculates(self) -> bool:
        """Whether this decoder has something to draft with (a draft model, or n-grams)."""
        return self.draft is not None or drafter_entry(self.drafter).uses_pool

    # -- public API ---------------------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        sampling: SamplingParams | None = None,
        *,
        num_draft_tokens: int | None = None,
        use_draft: bool = True,
        stop_ids: Sequence[int] = (),
        logprobs: int | None = None,
    ) -> list[GenerationResult]:
        """Decode a batch of tokenized prompts; results in prompt order. ``logprobs``: also each token's
        log-probability under the target and this many top alternatives (0: the token's own only)."""
        engine, jobs, t0, errors = self._submit(
            prompts, max_tokens, sampling, num_draft_tokens, use_draft, stop_ids, stream=False, logprobs=logprobs
        )
        engine.run_until_idle()
        if errors:
            raise errors[0]
        return [self._result(job, t0) for job in jobs]

    def stream(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        sampling: SamplingParams | None = None,
        *,
        num_draft_tokens: int | None = None,
        use_draft: bool = True,
        stop_ids: Sequence[int] = (),
        logprobs: int | None = None,
    ) -> Iterator[list[int] | GenerationResult]:
        """Yield the tokens each step commits for one prompt, then the final GenerationResult."""
        engine, jobs, t0, errors = self._submit(
            [prompt], max_tokens, sampling, num_draft_tokens, use_draft, stop_ids, stream=True, logprobs=logprobs
        )
        chunks: list[list[int]] = []
        jobs[0].on_tokens = lambda new, _logits, _final: chunks.append(new)
        busy = True
        while busy:
            busy = engine.iterate()
            if errors:
                raise errors[0]
            while chunks:
                chunk = chunks.pop(0)
                if chunk:
                    yield chunk
        yield self._result(jobs[0], t0)

    # -- the jobs -----------------------------------------------------------------------------------------------
    def _validate(self, prompts: Sequence[Sequence[int]], max_tokens: int, k: int) -> None:
        if not prompts:
            raise GenerationError("no prompts given", hint="pass at least one prompt")
        if max_tokens <= 0:
            raise GenerationError(f"max_tokens must be > 0, got {max_tokens}", hint="ask for at least one token")
        check_draft_len(k)
        vocab = _vocab(self.target)
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise GenerationError(f"prompt {i} is empty", hint="give at least one token of prompt")
            if len(p) + max_tokens > self.context:
                raise GenerationError(
                    f"prompt {i} has {len(p)} tokens; with max_tokens={max_tokens} it exceeds the model's context "
                    f"of {self.context}",
                    hint="shorten the prompt or lower max_tokens",
                )
            if min(p) < 0 or max(p) >= vocab:
                raise GenerationError(
                    f"prompt {i} has token ids outside the vocabulary (0..{vocab - 1})",
                    hint="tokenize with the target's tokenizer",
                )

    def _engine(self, use_draft: bool, batch: int, need: int) -> InflightEngine:
        """An engine with room for ``batch`` sequences of ``need`` tokens (kept, and its caches, between calls)."""
        engine = self._engines.get(use_draft)
        if engine is None or engine.max_batch_size < batch or engine.pool.capacity < need:
            capacity = min(self.context, max(MIN_CAPACITY, 1 << (need - 1).bit_length()))
            size = max(batch, engine.max_batch_size if engine is not None else 1)
            drafter = None
            if use_draft:
                drafter = engine_drafter(
                    self.drafter,
                    draft_model=self.draft,
                    pool=self.ngram_pool,
                    vocab=_vocab(self.target),
                    slots=size,
                    capacity=capacity,
                    policy=self.policy,
                    fast_step=self.fast_step,
                )
            engine = InflightEngine(
                self.target,
                drafter=drafter,
                max_batch_size=size,
                slots=size,
                capacity=capacity,
                name="decoder",
                fast_step=self.fast_step,
            )
            self._engines[use_draft] = engine
        engine.head = self.head
        return engine

    def _submit(self, prompts, max_tokens, sampling, num_draft_tokens, use_draft, stop_ids, stream, logprobs=None):
        sampling = sampling or SamplingParams()
        k = self.max_draft_len if num_draft_tokens is None else num_draft_tokens
        use_draft = use_draft and self.speculates and k > 0
        self._validate(prompts, max_tokens, k if use_draft else 0)
        stops = [[t] for t in sorted(set(self.eos_ids) | set(stop_ids))]
        need = max(len(p) for p in prompts) + max_tokens + 1
        engine = self._engine(use_draft, len(prompts), need)
        jobs: list[Job] = []
        errors: list[Exception] = []
        for i, p in enumerate(prompts):
            job = Job(
                tokens=list(p),
                max_new=max_tokens,
                on_tokens=lambda *_: None,
                on_error=errors.append,
                sampling=sampling,
                num_draft_tokens=k if use_draft else 0,
                stop_words=stops,
                stream=stream,
                generator=None if sampling.greedy else sampling.generator(i),
                logprobs=logprobs,
            )
            engine.submit(job)
            jobs.append(job)
        return engine, jobs, time.perf_counter(), errors

    @staticmethod
    def _result(job: Job, t0: float) -> GenerationResult:
        job.stats.total_s = time.perf_counter() - t0
        lps = list(job.token_logprobs) if job.logprobs is not None else None
        return GenerationResult(list(job.out), job.finish_reason, job.stats, lps)
