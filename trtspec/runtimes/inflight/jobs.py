"""What one request asks of an engine (the TensorRT-LLM request semantics), and its per-request decoding state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from trtspec.runtimes.inflight.kv_pool import Slot
from trtspec.speculative.rules import SamplingParams, SpecStats

# (new tokens, their generation logits [n, V] or None, final)
TokenSink = Callable[[list[int], "torch.Tensor | None", bool], None]
ErrorSink = Callable[[Exception], None]


@dataclass
class Job:
    """Generate up to ``max_new`` tokens after ``tokens``.

    - ``draft`` given (external draft, TRT-LLM's ``draft_tokens_external``): one step that verifies those tokens and
      returns the accepted ones plus the target's next token.
    - ``num_draft_tokens`` K > 0 on an engine with a drafter: speculative decoding, each step verifying K proposals.
    - otherwise: plain decoding, one token a step.
    Tokens equal to ``end_id`` end the sequence and are not returned (TRT-LLM); a stop word ends it and is returned;
    neither before ``sampling.min_tokens`` tokens.
    """

    tokens: list[int]
    max_new: int
    on_tokens: TokenSink
    on_error: ErrorSink
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None
    draft: list[int] | None = None
    draft_logits: torch.Tensor | None = None  # [K, V] raw draft logits (rejection sampling); None: draft as one-hot
    num_draft_tokens: int = 0
    stop_words: Sequence[Sequence[int]] = ()
    bad_words: Sequence[Sequence[int]] = ()
    stream: bool = False
    return_logits: bool = False
    logprobs: int | None = None  # each emitted token's log-probability and this many top alternatives (None: none)
    generator: torch.Generator | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    cancelled: bool = False  # set from any thread; the engine stops the job at its next iteration
    # -- decoding state (engine thread only) --
    slot: Slot | None = None
    pending: list[int] = field(default_factory=list)  # tokens to feed the target in the next pass
    draft_state: Any = None  # the drafter's per-job state
    out: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    token_logprobs: list[Any] = field(default_factory=list)  # trtspec.speculative.acceptance.TokenLogprob per out token
    sent: int = 0  # tokens already delivered (streaming)
    done: bool = False
    finish_reason: str = "length"  # "stop" (end_id or a stop word), "length", "cancelled"

    @property
    def external(self) -> bool:
        """A one-step verification of draft tokens given with the request."""
        return self.draft is not None

    def history(self) -> list[int]:
        return self.tokens + self.out

    @property
    def length(self) -> int:
        """len(history()), without building it."""
        return len(self.tokens) + len(self.out)

    def end_ids(self) -> list[int]:
        """The tokens that end the sequence by themselves: end_id and one-token stop words. Before
        ``sampling.min_tokens`` tokens they are banned (and longer stop words not matched): nothing ends it sooner."""
        ends = [] if self.end_id is None else [self.end_id]
        return ends + [int(w[0]) for w in self.stop_words if len(w) == 1 and int(w[0]) not in ends]

    def cancel(self) -> None:
        self.cancelled = True
