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
from trtspec.speculative.rules import MAX_DRAFT_LEN, check_draft_len, check_int32, number_of, validate_sampling


def validate_max_tokens(max_tokens: int, name: str = "max_tokens") -> None:
    """At least one token, and an INT32 (the contract's type: a larger value would wrap). ``name``: the field as
    the door calls it (the OpenAI API's ``max_completion_tokens``)."""
    if number_of(name, max_tokens, int) < 1:
        raise GenerationError(f"{name} must be >= 1, got {max_tokens}", hint="ask for at least one token")
    check_int32(name, max_tokens)


def validate_num_draft_tokens(k: int | None, max_draft_len: int = MAX_DRAFT_LEN) -> None:
    """None (the deployment's K), else the one K rule (trtspec.speculative.rules.check_draft_len)."""
    if k is not None:
        check_draft_len(k, max_draft_len)


def validate_prompt(prompt: str | bytes) -> None:
    """Some text that is not only whitespace."""
    if not (prompt.strip() if isinstance(prompt, (str, bytes)) else prompt):
        raise GenerationError("the prompt is empty", hint="give some text to continue")


def validate_prompt_tokens(n_prompt: int, max_tokens: int | None, max_input_len: int, max_seq_len: int) -> None:
    """The prompt's tokens (as the target's tokenizer counts them, special tokens and chat template included) fit
    max_input_len, and prompt + max_tokens fit max_seq_len (not checked for max_tokens None: not known yet)."""
    if n_prompt > max_input_len:
        raise GenerationError(
            f"the prompt has {n_prompt} tokens, more than max_input_len ({max_input_len})", hint="shorten the prompt"
        )
    if max_tokens is not None and n_prompt + max_tokens > max_seq_len:
        raise GenerationError(
            f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) exceeds max_seq_len ({max_seq_len})",
            hint="shorten the prompt or lower max_tokens",
        )


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
