"""The OpenAI request bodies trtspec accepts, their validation, and OpenAI's error shape.

Fields follow OpenAI's API reference for ``/v1/chat/completions`` and ``/v1/completions``. A field whose meaning
trtspec cannot honour (``logit_bias``, tools ...) is refused with a 400 that names it, never silently ignored
(``n`` > 1 is served: n sequences, trtspec.serving.openai.choices); fields that change nothing here (``user``,
``metadata``, ``store``) and unknown ones are ignored, as vLLM does, so that load tools that add their own fields
keep working. Extensions, as vLLM names them:
``top_k``, ``repetition_penalty``, ``min_tokens`` (the sampling fields of trtspec.request_fields, every one under its
own name), and ``num_draft_tokens`` (the draft length K for this request; 0 = target only).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from trtspec.errors import GenerationError
from trtspec.request_fields import SAMPLING_FIELDS
from trtspec.speculative.rules import MAX_DRAFT_LEN, validate_sampling
from trtspec.triton_repo.runtime_utils import error_message
from trtspec.validation import validate_max_tokens, validate_num_draft_tokens, validate_top_logprobs

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "service_unavailable_error",
}


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or ERROR_TYPES.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_field(param: str, message: str, code: str | None = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


MAX_CHOICES = 16  # n: choices per request, each one sequence of its own on the server


# strict: JSON types are not converted ("8" or true is not an integer, "yes" not a boolean; an int is a number).
STRICT = ConfigDict(extra="ignore", strict=True)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class _Common(BaseModel):
    """Fields both endpoints share."""

    model_config = STRICT
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # extensions
    top_k: int | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    num_draft_tokens: int | None = None

    def sampling(self) -> dict[str, Any]:
        """The request's sampling fields (trtspec.request_fields) that it sets, by name."""
        return {f.name: getattr(self, f.name) for f in SAMPLING_FIELDS if getattr(self, f.name) is not None}


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]  # required: a message without text (tool calls) cannot be served here


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None


def parse_request(cls: type[_Common], body: Any) -> Any:
    """The validated request, or an OpenAIError 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise OpenAIError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        request = cls.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        # Union members name themselves in the location ("str", "list[ContentPart]"): not fields (e.g. "stream").
        loc = [str(p) for p in err.get("loc", ()) if str(p) != "str" and not str(p).startswith(("function-", "list["))]
        param = ".".join(loc) or None
        if err.get("type") == "missing":
            raise bad_field(
                param or "body", f"missing required parameter: {param!r}", code="missing_required_parameter"
            ) from None
        got = repr(err.get("input"))
        got = got if len(got) <= 40 else got[:37] + "..."
        raise bad_field(
            param or "body",
            f"invalid value for {param!r}: {err.get('msg')}, got {got} (hint: values are not converted between "
            "JSON types: send the type the API reference gives)",
        ) from None
    _refuse_unsupported(request)
    return request


def _refuse_unsupported(r: _Common) -> None:
    """Fields whose meaning cannot be honoured here: refused by name (400)."""
    if r.n is not None and not 1 <= r.n <= MAX_CHOICES:
        raise bad_field("n", f"n must be in 1..{MAX_CHOICES}, got {r.n} (hint: send more requests for more choices)")
    if r.logit_bias:
        raise bad_field("logit_bias", "logit_bias is not supported by this server", code="unsupported_parameter")
    requested_logprobs(r)  # 0..20 alternatives, top_logprobs only with logprobs
    if r.stream_options is not None and not r.stream:
        raise bad_field("stream_options", "stream_options is only allowed when stream is true")
    if isinstance(r, ChatCompletionRequest):
        if r.tools or r.tool_choice not in (None, "none"):
            raise bad_field("tools", "tools are not supported by this server", code="unsupported_parameter")
        if r.response_format and r.response_format.get("type", "text") != "text":
            raise bad_field(
                "response_format", "only response_format {'type': 'text'} is supported", code="unsupported_parameter"
            )
        if not r.messages:
            raise bad_field("messages", "messages must hold at least one message")
        for i, m in enumerate(r.messages):
            if isinstance(m.content, list) and any(p.type != "text" for p in m.content):
                raise bad_field(
                    f"messages.{i}.content", "only text content parts are supported", code="unsupported_parameter"
                )
    else:
        assert isinstance(r, CompletionRequest)
        if isinstance(r.prompt, list) and len(r.prompt) != 1:
            raise bad_field("prompt", f"prompt must be one string (got a list of {len(r.prompt)})")
        if r.suffix:
            raise bad_field("suffix", "suffix is not supported by this server", code="unsupported_parameter")
        if r.best_of not in (None, 1):
            raise bad_field("best_of", "best_of must be 1", code="unsupported_parameter")


def requested_logprobs(r: _Common) -> int | None:
    """How many alternatives per token the request asks for with its log-probabilities (None: no logprobs), by
    trtspec.validation's rule (0..20, top_logprobs only with logprobs true): chat ``logprobs`` + ``top_logprobs``,
    completions ``logprobs`` N."""
    if isinstance(r, ChatCompletionRequest):
        param, top, wanted = "top_logprobs", r.top_logprobs or 0, bool(r.logprobs)
    else:
        assert isinstance(r, CompletionRequest)
        param, top, wanted = "logprobs", r.logprobs or 0, r.logprobs is not None
    try:
        validate_top_logprobs(top, wanted, param)
    except GenerationError as exc:
        raise bad_field(param, error_message(exc)) from None
    return top if wanted else None


def requested_max_tokens(r: _Common) -> tuple[str, int | None]:
    """(the field that set it, its value): ``max_completion_tokens`` wins over the deprecated ``max_tokens``."""
    if isinstance(r, ChatCompletionRequest) and r.max_completion_tokens is not None:
        return "max_completion_tokens", r.max_completion_tokens
    return "max_tokens", r.max_tokens


def stop_strings(r: _Common) -> list[str]:
    stops = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
    if len(stops) > 4:
        raise bad_field("stop", f"stop holds at most 4 sequences (got {len(stops)})")
    if any(not s for s in stops):
        raise bad_field("stop", "stop sequences must not be empty")
    return stops


def check_generation_fields(
    max_tokens: tuple[str, int | None],
    sampling: dict[str, Any],
    num_draft_tokens: int | None,
    max_draft_len: int = MAX_DRAFT_LEN,
) -> None:
    """The request rules for max tokens, sampling (``sampling``: the fields set, by name) and K: trtspec.validation's,
    the same rule and message as at every other door (the CLI, the ensemble, the Triton models), raised as a 400
    naming the field. ``max_draft_len``: the deployment's bound on K."""
    field, n = max_tokens
    checks: list[tuple[str, Any]] = [
        (field, lambda: validate_max_tokens(n, field) if n is not None else None),
        *((name, lambda name=name, v=v: validate_sampling(**{name: v})) for name, v in sampling.items()),
        ("num_draft_tokens", lambda: validate_num_draft_tokens(num_draft_tokens, max_draft_len)),
    ]
    for param, check in checks:
        try:
            check()
        except GenerationError as exc:
            raise bad_field(param, error_message(exc)) from None  # worded as the Triton models word it


def message_text(m: ChatMessage) -> str:
    if isinstance(m.content, str):
        return m.content
    return "".join(p.text or "" for p in m.content)
