"""Draft-target speculative decoding over Hugging Face causal LMs, in process.

Each step the draft proposes K tokens from its own KV cache, the target scores all of them (plus the bonus position)
in one forward pass, the longest acceptable prefix is emitted with the target's own next token, and both caches are
rolled back to the committed length (cropped, never recomputed). Greedy output equals target-only greedy output;
sampled output follows the target's distribution (see ``acceptance``). ``use_draft=False`` runs target-only decoding
through the same code path.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trtspec.engines.torch_runtime.acceptance import accepts, residual
from trtspec.engines.torch_runtime.head import lazy_head
from trtspec.engines.torch_runtime.sampling import SamplingParams, logits_to_probs, sample
from trtspec.engines.torch_runtime.state import ModelState
from trtspec.errors import GenerationError, IncompatibleModelsError

MAX_DRAFT_LEN = 16


@dataclass
class RequestStats:
    """Per-request speculative decoding statistics (timings are the batch's wall clock)."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    target_steps: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    target_s: float = 0.0
    total_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.output_tokens / self.target_steps if self.target_steps else 0.0

    def to_dict(self) -> dict[str, float | int]:
        decode_s = max(self.total_s - self.prefill_s, 1e-9)
        return {
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "target_steps": self.target_steps,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "prefill_s": round(self.prefill_s, 4),
            "draft_s": round(self.draft_s, 4),
            "target_s": round(self.target_s, 4),
            "total_s": round(self.total_s, 4),
            "decode_tok_per_s": round(self.output_tokens / decode_s, 2),
        }


@dataclass
class GenerationResult:
    token_ids: list[int]
    finish_reason: str  # "stop" (a stop token was emitted) or "length" (max_tokens reached)
    stats: RequestStats = field(default_factory=RequestStats)


@dataclass
class _Row:
    index: int
    seq: list[int]
    prompt_len: int
    max_tokens: int
    generator: torch.Generator | None
    out: list[int] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    finish: str | None = None


def _vocab(model: Any) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _context(model: Any) -> int:
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class SpeculativeDecoder:
    """Draft-target decoding with a target and an optional draft (both eval-mode HF causal LMs on one device)."""

    def __init__(self, target: Any, draft: Any | None = None, *, max_draft_len: int = 4,
                 eos_ids: Sequence[int] = (), pad_id: int = 0) -> None:
        if not 1 <= max_draft_len <= MAX_DRAFT_LEN:
            raise GenerationError(f"draft length K={max_draft_len} is out of range", hint=f"use 1..{MAX_DRAFT_LEN}")
        if draft is not None and _vocab(draft) != _vocab(target):
            raise IncompatibleModelsError(
                f"draft vocabulary ({_vocab(draft)}) differs from the target's ({_vocab(target)})",
                hint="draft and target must share one tokenizer; `trtspec check` compares them")
        self.target = target
        self.draft = draft
        self.max_draft_len = max_draft_len
        self.eos_ids = tuple(eos_ids)
        self.pad_id = pad_id
        self.context = min(_context(target), _context(draft) if draft is not None else 1 << 30)
        self.head = lazy_head(target)

    # -- public API ---------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int, sampling: SamplingParams | None = None,
                 *, draft_len: int | None = None, use_draft: bool = True,
                 stop_ids: Sequence[int] = ()) -> list[GenerationResult]:
        """Decode a batch of tokenized prompts; results in prompt order."""
        results: list[GenerationResult] = []
        for event in self._decode(prompts, max_tokens, sampling or SamplingParams(), draft_len, use_draft, stop_ids):
            if isinstance(event, list):
                results = event
        return results

    def stream(self, prompt: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None, *,
               draft_len: int | None = None, use_draft: bool = True,
               stop_ids: Sequence[int] = ()) -> Iterator[list[int] | GenerationResult]:
        """Yield the tokens each step commits for one prompt, then the final GenerationResult."""
        for event in self._decode([prompt], max_tokens, sampling or SamplingParams(), draft_len, use_draft, stop_ids):
            if isinstance(event, list):
                yield event[0]
            else:
                yield event[1]

    # -- the loop -----------------------------------------------------------------------------------------------
    def _validate(self, prompts: Sequence[Sequence[int]], max_tokens: int, k: int) -> None:
        if not prompts:
            raise GenerationError("no prompts given", hint="pass at least one prompt")
        if max_tokens <= 0:
            raise GenerationError(f"max_tokens must be > 0, got {max_tokens}", hint="ask for at least one token")
        if not 0 <= k <= MAX_DRAFT_LEN:
            raise GenerationError(f"draft length K={k} is out of range", hint=f"use 1..{MAX_DRAFT_LEN}")
        vocab = _vocab(self.target)
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise GenerationError(f"prompt {i} is empty", hint="give at least one token of prompt")
            if len(p) + max_tokens > self.context:
                raise GenerationError(
                    f"prompt {i} has {len(p)} tokens; with max_tokens={max_tokens} it exceeds the model's context "
                    f"of {self.context}", hint="shorten the prompt or lower max_tokens")
            if min(p) < 0 or max(p) >= vocab:
                raise GenerationError(f"prompt {i} has token ids outside the vocabulary (0..{vocab - 1})",
                                      hint="tokenize with the target's tokenizer")

    @torch.inference_mode()
    def _decode(self, prompts, max_tokens, sampling, draft_len, use_draft, stop_ids):
        k = self.max_draft_len if draft_len is None else draft_len
        use_draft = use_draft and self.draft is not None
        if not use_draft:
            k = 0
        self._validate(prompts, max_tokens, k)
        stops = set(self.eos_ids) | set(stop_ids)
        t_start = time.perf_counter()
        rows = [_Row(i, list(p), len(p), max_tokens, None if sampling.greedy else sampling.generator(i))
                for i, p in enumerate(prompts)]
        for r in rows:
            r.stats.prompt_tokens = r.prompt_len
        active = list(rows)
        tgt = ModelState(self.target, len(rows), self.pad_id)
        dft = ModelState(self.draft, len(rows), self.pad_id) if use_draft else None
        # Prefill everything but the last prompt token, which each step feeds as the pending token.
        prefill = [r.seq[:-1] for r in rows]
        if any(prefill):
            tgt.forward(prefill, keep=1)
            if dft is not None:
                dft.forward(prefill, keep=1)
        t_prefill = time.perf_counter() - t_start
        for r in rows:
            r.stats.prefill_s = t_prefill

        while active:
            remaining = max(r.max_tokens - len(r.out) for r in active)
            room = self.context - max(len(r.seq) for r in active)
            k_eff = max(0, min(k, remaining - 1, room - 1))
            drafts, draft_probs = self._propose(dft, active, k_eff, sampling) if k_eff else ([[] for _ in active], None)
            t0 = time.perf_counter()
            feeds = [r.seq[int(tgt.n_valid[i]):] + drafts[i] for i, r in enumerate(active)]
            if self.head is not None:  # logits only where they can be used (trtspec.engines.torch_runtime.head)
                states, head = tgt.forward(feeds, keep=k_eff + 1, hidden=True), self.head
            else:  # full logits for the K + 1 positions; "applying the head" is then the identity
                states, head = tgt.forward(feeds, keep=k_eff + 1), _identity
            accepted = self._accept(active, drafts, draft_probs, states, head, sampling)
            t_target = time.perf_counter() - t0
            old_lens = [len(r.seq) for r in active]
            finished = []
            for i, (r, (n, nxt)) in enumerate(zip(active, accepted)):
                r.stats.target_steps += 1
                r.stats.target_s += t_target
                r.stats.draft_tokens += k_eff
                r.stats.accepted_tokens += n
                emitted = drafts[i][:n] + [nxt]
                for j, tok in enumerate(emitted):
                    if tok in stops:
                        emitted, r.finish = emitted[: j + 1], "stop"
                        break
                if len(r.out) + len(emitted) >= r.max_tokens:
                    emitted = emitted[: r.max_tokens - len(r.out)]
                    r.finish = r.finish or "length"
                r.out += emitted
                r.seq += emitted
                if r.finish:
                    finished.append(i)
                yield (r.index, emitted)
            # Roll back: the target keeps all committed tokens but the new pending one; the draft keeps what it saw
            # of them (it was fed the old sequence and its first k_eff - 1 proposals).
            tgt.truncate(torch.tensor([len(r.seq) - 1 for r in active]))
            if dft is not None and k_eff:
                dft.truncate(torch.tensor([old + min(n, k_eff - 1) for old, (n, _) in zip(old_lens, accepted)]))
            if finished:
                keep = [i for i in range(len(active)) if i not in set(finished)]
                active = [active[i] for i in keep]
                if active:
                    idx = torch.tensor(keep)
                    tgt.select(idx)
                    if dft is not None:
                        dft.select(idx)
        total = time.perf_counter() - t_start
        results = []
        for r in rows:
            r.stats.output_tokens = len(r.out)
            r.stats.total_s = total
            results.append(GenerationResult(r.out, r.finish or "length", r.stats))
        yield results

    def _propose(self, dft: ModelState | None, active: list[_Row], k: int, sampling: SamplingParams):
        """K draft tokens per row from the draft's cache (and their distributions q when sampling)."""
        assert dft is not None
        t0 = time.perf_counter()
        drafts: list[list[int]] = [[] for _ in active]
        probs: list[list[torch.Tensor]] = [[] for _ in active]
        feed = [r.seq[int(dft.n_valid[i]):] for i, r in enumerate(active)]
        for step in range(k):
            logits = dft.forward(feed, keep=1)[:, -1, :]
            if sampling.greedy:
                toks = logits.argmax(-1).tolist()
            else:
                q = logits_to_probs(logits, sampling)
                toks = []
                for i, r in enumerate(active):
                    probs[i].append(q[i])
                    toks.append(sample(q[i], r.generator))
            for i, t in enumerate(toks):
                drafts[i].append(t)
            if step < k - 1:
                feed = [[t] for t in toks]
        dt = time.perf_counter() - t0
        for r in active:
            r.stats.draft_s += dt
        return drafts, (None if sampling.greedy else [torch.stack(p) for p in probs])

    def _accept(self, active, drafts, draft_probs, states, head, sampling) -> list[tuple[int, int]]:
        """(accepted count, next token) per row. ``head`` turns ``states[rows, j]`` into logits; it runs position
        by position on the rows still undecided, so with hidden states and the target's lm_head the logits are
        computed only where they are used. Greedy: accept while the draft token is the argmax. Sampling: the rules
        of acceptance.py (accept with probability min(1, p/q), else sample the residual; bonus token from p), with
        each row's uniforms drawn first, as accept_sampled draws them."""
        k = len(drafts[0]) if active else 0  # every row proposes k_eff tokens
        out: list[tuple[int, int] | None] = [None] * len(active)
        u = None if sampling.greedy or not k else [torch.rand(k, generator=r.generator) for r in active]
        undecided = list(range(len(active)))
        for j in range(k + 1):
            logits = head(states[undecided, j])  # [rows, V]
            going_on = []
            if sampling.greedy:
                for i, t in zip(undecided, logits.argmax(-1).tolist()):
                    if j < k and drafts[i][j] == t:
                        going_on.append(i)
                    else:
                        out[i] = (j, t)
            else:
                p = logits_to_probs(logits, sampling)
                for row, i in enumerate(undecided):
                    gen = active[i].generator
                    if j == k:  # every draft token accepted: the bonus token from p
                        out[i] = (j, sample(p[row], gen))
                        continue
                    tok, q = drafts[i][j], draft_probs[i][j]
                    if bool(accepts(u[i][j], q[tok], p[row, tok])):  # with probability min(1, p/q)
                        going_on.append(i)
                        continue
                    out[i] = (j, sample(residual(p[row], q), gen))
            undecided = going_on
            if not undecided:
                break
        return out  # type: ignore[return-value]
