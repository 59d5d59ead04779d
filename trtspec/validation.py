"""One set of rules for a generation request, applied before anything is sent, loaded or written.

The same rules hold in process (`trtspec generate --spec`), through a server (`--url`, `trtspec bench`,
``TritonLLMClient``) and for the draft/target pair (trtspec.build.check.check_pair: `check`, `repo`, `generate`).
The sampling rule is the core's (trtspec.speculative.rules.validate_sampling, which SamplingParams applies). Field
names are the
request contract's (TensorRT-LLM's): ``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``,
``num_draft_tokens`` (K of one request; the deployment's bound is ``max_draft_len``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtspec.errors import GenerationError
from trtspec.request_fields import sampling_values
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


MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


def validate_top_logprobs(top: int, return_log_probs: bool, name: str = "top_logprobs") -> None:
    """0..MAX_TOP_LOGPROBS alternatives per token, and only when log-probabilities are asked for."""
    top = number_of(name, top, int)
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise GenerationError(
            f"{name} must be in 0..{MAX_TOP_LOGPROBS}, got {top}", hint="ask for at most 20 alternatives per token"
        )
    if top and not return_log_probs:
        raise GenerationError(
            f"{name} {top} needs log-probabilities to be returned", hint="set return_log_probs (OpenAI: logprobs) true"
        )


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
    **sampling: Any,
) -> None:
    """Every rule of one request; raises GenerationError naming the field, the value and what is allowed.
    ``sampling``: the other fields of trtspec.request_fields (penalties, min_tokens) by name."""
    validate_prompt(prompt)
    validate_max_tokens(max_tokens)
    validate_sampling(temperature, top_k, top_p, seed, **sampling)
    validate_num_draft_tokens(num_draft_tokens, max_draft_len)


def validate_fields(values: dict[str, Any]) -> None:
    """The rules applied to request fields by name (a client's ``request_inputs``); absent fields are not checked."""
    if "text_input" in values:
        validate_prompt(values["text_input"])
    if "max_tokens" in values:
        validate_max_tokens(values["max_tokens"])
    validate_sampling(**sampling_values(values))
    validate_num_draft_tokens(values.get("num_draft_tokens"))


# -- the ensemble inputs of TensorRT-LLM's contract that trtspec's draft-target models do not implement --------------
# The ensemble declares every input of upstream's (tests/upstream/ensemble_inputs.json), so that a client of
# TensorRT-LLM's ensemble does not meet Triton's "unexpected inference input". Each input below travels to
# preprocessing, which accepts its absence and upstream's default value silently and refuses any other value by name
# (``validate_unsupported_input``), before any engine work.
@dataclass(frozen=True)
class UnsupportedInput:
    """``defaults``: the values accepted silently (empty: only an absent or empty input); ``why``: what is missing."""

    defaults: tuple[Any, ...]
    why: str
    hint: str = ""


_LOGITS = "the ensemble returns text and speculative statistics, not logits or log-probabilities"
_LOGPROBS_HINT = "call the draft-target model (tensorrt_llm) with return_log_probs, or ask the OpenAI API for logprobs"
UNSUPPORTED_INPUTS: dict[str, UnsupportedInput] = {
    "decoder_text_input": UnsupportedInput((), "it is for encoder-decoder models; draft and target are decoder-only"),
    "num_return_sequences": UnsupportedInput(
        (1,), "one sequence per request", "send the request once per sequence, each with its own seed"
    ),
    "length_penalty": UnsupportedInput((1.0,), "it applies to beam search, and draft-target decoding has beam width 1"),
    "return_log_probs": UnsupportedInput((False,), _LOGITS, _LOGPROBS_HINT),
    "return_context_logits": UnsupportedInput((False,), _LOGITS),
    "return_generation_logits": UnsupportedInput((False,), _LOGITS),
    "beam_width": UnsupportedInput((1,), "draft-target decoding has beam width 1 (TensorRT-LLM's too)"),
    "prompt_embedding_table": UnsupportedInput((), "prompt tuning is not implemented"),
    "prompt_table_extra_id": UnsupportedInput((), "prompt tuning is not implemented"),
    "prompt_vocab_size": UnsupportedInput((0,), "prompt tuning is not implemented"),
    "embedding_bias_words": UnsupportedInput((), "embedding bias is not implemented", "send bad_words to ban words"),
    "embedding_bias_weights": UnsupportedInput((), "embedding bias is not implemented", "send bad_words to ban words"),
    "lora_task_id": UnsupportedInput((), "LoRA adapters are not implemented"),
    "lora_weights": UnsupportedInput((), "LoRA adapters are not implemented"),
    "lora_config": UnsupportedInput((), "LoRA adapters are not implemented"),
    "guided_decoding_guide_type": UnsupportedInput((), "guided decoding is not implemented"),
    "guided_decoding_guide": UnsupportedInput((), "guided decoding is not implemented"),
}
# Upstream inputs that trtspec honours without a model input of its own: num_input_tokens and num_output_tokens are
# in every response, asked for or not.
ALWAYS_HONOURED_INPUTS = ("return_num_input_tokens", "return_num_output_tokens")


def _elements(value: Any) -> list[Any]:
    """The elements of one request's input (a numpy row, a list or a scalar), flattened."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [e for v in value for e in _elements(v)]
    return [value]


def validate_unsupported_input(name: str, value: Any) -> None:
    """Refuse one request's value of an input in UNSUPPORTED_INPUTS unless it is absent, empty or upstream's default."""
    rule = UNSUPPORTED_INPUTS[name]
    items = [e for e in _elements(value) if e not in (b"", "")]
    if not items:
        return
    scalar = len(items) == 1 and not isinstance(items[0], (bytes, str))
    if scalar and any(items[0] == d and isinstance(items[0], bool) == isinstance(d, bool) for d in rule.defaults):
        return
    v = items[0]
    shown = (
        "" if not scalar else f" {v:g}" if isinstance(v, float) else f" {str(v).lower() if isinstance(v, bool) else v}"
    )
    allowed = " or ".join(str(d).lower() if isinstance(d, bool) else str(d) for d in rule.defaults)
    hint = f"leave {name} out" + (f" or send {allowed} (upstream's default)" if allowed else "")
    raise GenerationError(
        f"{name}{shown} is not supported by trtspec's draft-target models: {rule.why}",
        hint=hint + (f"; {rule.hint}" if rule.hint else ""),
    )
