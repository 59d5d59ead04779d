"""What every draft-target path shares: the draft-length limit, sampling settings, and one statistics type.

Torch-free (the Triton orchestrator imports it). The acceptance rules themselves, which need the target's
logits, are in ``trtspec.speculative.acceptance``; the paths that use them are the in-flight engine
(``trtspec.runtimes.inflight``: in process, and the torch runtime's Triton models) and, through the target engine's
``draft_input_ids``, the Triton orchestrator (``trtspec.triton_repo.orchestrator``), which counts acceptance with
``accepted_prefix`` as TensorRT-LLM's ``examples/prompt_lookup/run_dtm_pld.py`` does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from trtspec.errors import GenerationError

SEED_MAX = 2**64 - 1  # the ensemble's seed is UINT64
INT32_MAX = 2**31 - 1  # max_tokens, top_k, min_tokens and num_draft_tokens are INT32 in the Triton contract
PENALTY_MAX = 2.0  # presence_penalty and frequency_penalty: -2..2 (OpenAI's range)


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token's log-probability under the target (log-softmax of its logits at that position, after bad
    words: before temperature, top-k and top-p, as OpenAI's and vLLM's logprobs), and the ``top`` most likely
    tokens there, most likely first, as (token, log-probability)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def check_int32(name: str, value: int) -> None:
    """An INT32 field of the Triton contract: a larger value would wrap (Triton's JSON parser does so silently)."""
    if value > INT32_MAX:
        raise GenerationError(
            f"{name} must be at most {INT32_MAX} (2**31-1), got {value}",
            hint=f"{name} is an INT32 in the request contract",
        )


def number_of(name: str, value: Any, kind: type) -> Any:
    """``value`` when it is a number of ``kind`` (int, or int/float; never bool), else a GenerationError."""
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise GenerationError(
            f"{name} must be {'a number' if kind is float else 'an integer'}, got {value!r}",
            hint=f"pass {name} as {'a number' if kind is float else 'an integer'}",
        )
    return value


def validate_sampling(
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    min_tokens: int = 0,
) -> None:
    """Temperature >= 0 (0 = greedy), top_k >= 0 (0 = off), 0 < top_p <= 1 (1 = off), 0 <= seed < 2**64,
    repetition_penalty > 0 (1 = off), presence_penalty and frequency_penalty in -2..2 (0 = off; OpenAI's range),
    min_tokens >= 0 (0 = off)."""
    if number_of("temperature", temperature, float) < 0 or temperature != temperature:
        raise GenerationError(f"temperature must be >= 0, got {temperature}", hint="0 means greedy")
    if number_of("top_k", top_k, int) < 0:
        raise GenerationError(f"top_k must be >= 0, got {top_k}", hint="0 disables top-k filtering")
    check_int32("top_k", top_k)
    if not 0.0 < number_of("top_p", top_p, float) <= 1.0:
        raise GenerationError(f"top_p must be in (0, 1], got {top_p}", hint="1.0 disables top-p filtering")
    if seed is not None and not 0 <= number_of("seed", seed, int) <= SEED_MAX:
        raise GenerationError(f"seed must be in 0..2**64-1, got {seed}", hint="any non-negative integer")
    if not 0.0 < number_of("repetition_penalty", repetition_penalty, float) < math.inf:
        raise GenerationError(
            f"repetition_penalty must be > 0, got {repetition_penalty}",
            hint="1.0 disables it; > 1 discourages tokens already in the prompt or the output",
        )
    for name, value in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if not -PENALTY_MAX <= number_of(name, value, float) <= PENALTY_MAX:
            raise GenerationError(
                f"{name} must be in -2..2, got {value}", hint="0 disables it; > 0 discourages repeated tokens"
            )
    if number_of("min_tokens", min_tokens, int) < 0:
        raise GenerationError(f"min_tokens must be >= 0, got {min_tokens}", hint="0 lets end_id come at any step")
    check_int32("min_tokens", min_tokens)


# The most draft tokens per step any trtspec path accepts (the spec's speculative.max_draft_len is 1..this).
MAX_DRAFT_LEN = 16


@dataclass(frozen=True)
class SamplingParams:
    """Temperature 0 means greedy; top_k 0 and top_p 1.0 mean no filtering; seed makes sampled runs reproducible.

    Penalties and min_tokens (TensorRT-LLM's semantics, ``cpp/tensorrt_llm/kernels/penaltyKernels.cu``): a token
    that occurs in the prompt or the output so far has its logit divided by ``repetition_penalty`` (multiplied when
    negative), lowered by ``presence_penalty`` and by ``frequency_penalty`` per occurrence, after temperature; nothing
    ends the sequence before ``min_tokens`` tokens (end_id and one-token stop words banned, longer ones not matched).
    They shape the target's distribution, which is what acceptance compares with, so speculative output stays exactly
    the target's (trtspec.speculative.acceptance)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0

    def __post_init__(self) -> None:
        validate_sampling(**{f.name: getattr(self, f.name) for f in fields(self)})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits (min_tokens is a ban, not a penalty)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @classmethod
    def from_request(
        cls, temperature: float, top_k: int, top_p: float, seed: int | None, **penalties: Any
    ) -> SamplingParams:
        """TensorRT-LLM's request semantics: top_k 1 is greedy too, and top_p outside (0, 1] means no filtering.
        ``penalties``: repetition_penalty, presence_penalty, frequency_penalty, min_tokens, as they are."""
        greedy = temperature <= 0.0 or top_k == 1
        return cls(
            0.0 if greedy else float(temperature),
            0 if greedy else int(top_k),
            float(top_p) if not greedy and 0.0 < top_p <= 1.0 else 1.0,
            seed,
            **penalties,
        )

    def with_seed(self, seed: int | None) -> SamplingParams:
        return replace(self, seed=seed)

    def generator(self, offset: int = 0) -> Any:
        """A CPU torch.Generator for one sequence (seed + offset), nondeterministically seeded without a seed."""
        import torch

        g = torch.Generator()
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed + offset)
        return g


def check_draft_len(k: int, max_draft_len: int = MAX_DRAFT_LEN, what: str = "num_draft_tokens") -> int:
    """The one rule for a request's K (``num_draft_tokens``): ``k`` if 0 <= k <= max_draft_len (the deployment's
    bound; MAX_DRAFT_LEN where none is known), else a GenerationError naming the bound. 0 means no draft. A negative
    K is worded without the bound, so that a door that does not know the deployment's yet says the same.

    Every door applies it with its deployment's max_draft_len: the CLI (in process and ``--url``), the OpenAI API,
    the BLS orchestrator and the in-process torch model (trtspec.triton_repo.orchestrator.plan_request) and the
    in-flight engine."""
    if number_of(what, k, int) < 0:
        raise GenerationError(f"{what} must be >= 0, got {k}", hint="0 is target-only decoding")
    if k > max_draft_len:
        hint = (
            f"this deployment's max_draft_len is {max_draft_len}; 0 is target-only decoding; a larger K needs a "
            "larger speculative.max_draft_len and a rebuild"
            if max_draft_len < MAX_DRAFT_LEN
            else f"K is at most {MAX_DRAFT_LEN}; 0 is target-only decoding"
        )
        raise GenerationError(f"{what} must be in 0..{max_draft_len}, got {k}", hint=hint)
    return int(k)


def check_max_draft_len(k: int, what: str = "max_draft_len") -> int:
    """The one rule for a deployment's (or a tuning run's) K: 1..MAX_DRAFT_LEN."""
    if not 1 <= number_of(what, k, int) <= MAX_DRAFT_LEN:
        raise GenerationError(
            f"{what} {k} must be in 1..{MAX_DRAFT_LEN}",
            hint="K is the number of draft tokens proposed per target step",
        )
    return int(k)


def accepted_prefix(draft: Sequence[int], output: Sequence[int]) -> int:
    """How many leading draft tokens the target's output repeats: the accepted draft tokens of one step."""
    n = 0
    for d, t in zip(draft, output):
        if d != t:
            break
        n += 1
    return n


@dataclass
class SpecStats:
    """Per-request speculative decoding statistics, with TensorRT-LLM's names where it has them.

    ``total_draft_tokens`` counts proposed draft tokens, ``total_accepted_draft_tokens`` those the target accepted,
    ``target_steps`` the target's forward passes for the request (decoding iterations), ``no_draft_steps`` those
    that verified no draft token. Times: ``*_time_ns`` are wall
    clock (time.time_ns), ``*_s`` durations measured in process.
    """

    num_input_tokens: int = 0
    num_output_tokens: int = 0
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    target_steps: int = 0
    no_draft_steps: int = 0  # target steps that verified no draft token (nothing proposed, or chosen not to)
    steps_by_draft_len: dict[int, int] = field(default_factory=dict)  # target steps by their draft length K
    routed_to_target: bool = False
    arrival_time_ns: int = field(default_factory=time.time_ns)
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    draft_s: float = 0.0
    target_s: float = 0.0
    total_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (0 when nothing was proposed)."""
        return self.total_accepted_draft_tokens / self.total_draft_tokens if self.total_draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.num_output_tokens / self.target_steps if self.target_steps else 0.0

    def note_step(self, proposed: int, accepted: int) -> None:
        self.target_steps += 1
        self.no_draft_steps += proposed == 0
        self.steps_by_draft_len[proposed] = self.steps_by_draft_len.get(proposed, 0) + 1
        self.total_draft_tokens += proposed
        self.total_accepted_draft_tokens += accepted

    def note_tokens(self, n: int) -> None:
        if n:
            now = time.time_ns()
            self.first_token_time_ns = self.first_token_time_ns or now
            self.last_token_time_ns = now
            self.num_output_tokens += n

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for k in ("draft_s", "target_s", "total_s"):
            out[k] = round(out[k], 4)
        out["acceptance_rate"] = round(self.acceptance_rate, 4)
        out["tokens_per_step"] = round(self.tokens_per_step, 4)
        decode_ns = self.last_token_time_ns - self.first_token_time_ns
        out["decode_tok_per_s"] = (
            round((self.num_output_tokens - 1) / (decode_ns / 1e9), 2)
            if decode_ns > 0 and self.num_output_tokens > 1
            else None
        )
        return out
