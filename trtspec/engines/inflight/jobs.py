"""What one request asks of an engine (the TensorRT-LLM request semantics), and its per-request decoding state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from trtspec.engines.inflight.kv_pool import Slot
from trtspec.engines.torch_runtime.sampling import SamplingParams

# (new tokens, their generation logits [n, V] or None, final)
TokenSink = Callable[[list[int], "torch.Tensor | None", bool], None]
ErrorSink = Callable[[Exception], None]


@dataclass
class Job:
    """Generate ``max_new`` tokens after ``tokens``, or (with ``draft``) verify draft tokens and return the accepted
    ones plus the target's next token. Tokens equal to ``end_id`` end the sequence and are not returned (TRT-LLM)."""

    tokens: list[int]
    max_new: int
    on_tokens: TokenSink
    on_error: ErrorSink
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None
    draft: list[int] | None = None
    draft_logits: torch.Tensor | None = None  # [K, V] raw draft logits (rejection sampling); None: draft as one-hot
    stop_words: Sequence[Sequence[int]] = ()
    bad_words: Sequence[Sequence[int]] = ()
    stream: bool = False
    return_logits: bool = False
    generator: torch.Generator | None = None
    # -- decoding state (engine thread only) --
    slot: Slot | None = None
    pending: list[int] = field(default_factory=list)  # tokens to feed in the next pass
    out: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    sent: int = 0  # tokens already delivered (streaming)
    done: bool = False

    @property
    def verify(self) -> bool:
        return self.draft is not None

    def keep_count(self) -> int:
        """How many trailing logits of this pass the job needs."""
        return len(self.draft) + 1 if self.draft is not None else 1

    def history(self) -> list[int]:
        return self.tokens + self.out
