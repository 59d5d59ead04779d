"""One set of rules for a generation request, applied before anything is sent, loaded or written.

The same rules hold in process (`trtspec generate --spec`), through a server (`--url`, `trtspec bench`,
``TritonLLMClient``) and for the draft/target pair (trtspec.build.check.check_pair: `check`, `repo`, `generate`).
The sampling rule is the core's (trtspec.speculative.rules.validate_sampling, which SamplingParams applies). Field
names are the
request contract's (TensorRT-LLM's): ``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``,
``num_draft_tokens`` (K of one request; the deployment's bound is ``max_draft_len``).
"""

from __future__ import annotations

from typing import Any

from trtspec.errors import GenerationError
from trtspec.speculative.rules import MAX_DRAFT_LEN, number_of, validate_sampling


def validate_max_tokens(max_tokens: int) -> None:
    """At least one token."""
    if number_of("max_tokens", max_tokens, int) < 1:
        raise GenerationError(
            f"max_tokens must be >= 1, got {max_tokens}", hint="ask for at least one token (--max-tokens / -n)"
        )


def validate_num_draft_tokens(k: int | None, max_draft_len: int = MAX_DRAFT_LEN) -> None:
    """None (the deployment's K), 0 (target only) or 1..max_draft_len."""
    if k is None:
        return
    if not 0 <= number_of("num_draft_tokens", k, int) <= max_draft_len:
        bound = (
            f"K is at most {MAX_DRAFT_LEN}"
            if max_draft_len == MAX_DRAFT_LEN
            else f"the deployment's max_draft_len is {max_draft_len}"
        )
        raise GenerationError(
            f"num_draft_tokens must be in 0..{max_draft_len}, got {k}",
            hint=f"{bound}; 0 (or --no-draft) is target-only decoding",
        )


def validate_prompt(prompt: str | bytes) -> None:
    if not (prompt.strip() if isinstance(prompt, (str, bytes)) else prompt):
        raise GenerationError("the prompt is empty", hint="give some text to continue")


def validate_request(
    prompt: str | bytes,
    max_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    num_draft_tokens: int | None = None,
    max_draft_len: int = MAX_DRAFT_LEN,
) -> None:
    """Every rule of one request; raises GenerationError naming the field, the value and what is allowed."""
    validate_prompt(prompt)
    validate_max_tokens(max_tokens)
    validate_sampling(temperature, top_k, top_p, seed)
    validate_num_draft_tokens(num_draft_tokens, max_draft_len)


def validate_fields(values: dict[str, Any]) -> None:
    """The rules applied to request fields by name (a client's ``request_inputs``); absent fields are not checked."""
    if "text_input" in values:
        validate_prompt(values["text_input"])
    if "max_tokens" in values:
        validate_max_tokens(values["max_tokens"])
    validate_sampling(
        values.get("temperature", 0.0), values.get("top_k", 0), values.get("top_p", 1.0), values.get("seed")
    )
    validate_num_draft_tokens(values.get("num_draft_tokens"))
