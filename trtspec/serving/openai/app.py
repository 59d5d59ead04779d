"""The OpenAI-compatible HTTP API (Starlette): ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``,
``/health``, ``/metrics`` (Prometheus text), ``/version``.

Each request is validated and checked against the served model's context before it is sent; it then becomes one
request to the repository's entry model (ensemble or LLM-API model) in the ensemble field names that
``trtspec generate --url`` sends (trtspec.serving.contract). Streaming uses server-sent events as OpenAI does
(``data: {chunk}`` ... ``data: [DONE]``), with a last usage chunk when ``stream_options.include_usage`` is set.
``usage`` counts tokens; the draft-target statistics travel in the extension field ``speculative_decoding``
(TensorRT-LLM's names), which OpenAI clients ignore.

Every request first passes the guard (trtspec.serving.openai.guard: key, drain, content type, request id, metrics)
and the limits (trtspec.serving.openai.limits: body size, JSON depth, Unicode, prompt characters); parsing, the chat
template and tokenizing run on worker threads, so the event loop (and /health) never waits for them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from trtspec.errors import GenerationError
from trtspec.serving.metrics import CONTENT_TYPE, Registry
from trtspec.serving.openai.asgi import DONE, JSON, SSE, GenerationResponse, json_bytes, send_json, sse
from trtspec.serving.openai.backend import TritonBackend, TritonRequestError, TritonUnavailable
from trtspec.serving.openai.choices import choice_values, combined, gather_all, merged
from trtspec.serving.openai.deployment import ServedDeployment
from trtspec.serving.openai.guard import Guard, RequestMetrics, draining_error
from trtspec.serving.openai.limits import Limits, check_prompt_chars, parse_body, prompt_char_limit, read_body
from trtspec.serving.openai.logprobs import TokenTexts, chat_logprobs, completion_logprobs
from trtspec.serving.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    bad_field,
    check_generation_fields,
    message_text,
    parse_request,
    requested_logprobs,
    requested_max_tokens,
    stop_strings,
)
from trtspec.serving.openai.text import PromptTokenizer, StopMatcher
from trtspec.speculative.rules import MAX_DRAFT_LEN
from trtspec.triton_repo.runtime_utils import error_message
from trtspec.validation import validate_prompt, validate_prompt_tokens

# Phrases of the request errors trtspec's models answer (preprocessing, orchestrator, LLM-API model): a 400, not a 500.
REQUEST_ERROR_PHRASES = ("must be", "exceeds", "more than", "not valid", "is empty", "not supported", "out of range")
SHUTTING_DOWN_PHRASE = "shutting down"  # trtspec's models while draining (trtspec.triton_repo.control)
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass
class Prepared:
    """One validated request, ready to send."""

    kind: str  # "chat" | "completion"
    request: Any
    prompt: str
    prompt_tokens: int
    max_tokens: int
    values: dict[str, Any]
    stops: list[str]
    num_draft_tokens: int  # K of this request (0: target only)
    routed: bool
    logprobs: int | None = None  # alternatives per token with the log-probabilities (None: not asked)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


class OpenAIService:
    """The endpoints' logic over one served deployment."""

    def __init__(
        self,
        deployment: ServedDeployment,
        backend: TritonBackend,
        tokenizer: PromptTokenizer,
        limits: Limits | None = None,
    ) -> None:
        self.deployment = deployment
        self.backend = backend
        self.tokenizer = tokenizer
        self.created = int(time.time())
        if limits is None:
            limits = Limits(max_prompt_chars=prompt_char_limit(tokenizer.tok, self.max_input_len))
        self.limits = limits
        self.draining = False  # set when the server drains: /v1 answers 503, /health not ready
        self.token_texts = TokenTexts(tokenizer.tok)  # for logprobs: each token's own text (cached per token)
        self.metrics = RequestMetrics(Registry())
        self.metrics.registry.gauge("trtspec_openai_draining", "1 while the server drains").function(
            lambda: float(self.draining)
        )
        # Parsing, chat templates and tokenizing: off the event loop, on a few threads (tokenizers release the GIL).
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="trtspec-openai-prepare")

    @property
    def max_input_len(self) -> int:
        return self.deployment.max_input_len or self.deployment.max_seq_len

    async def off_loop(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # -- plain endpoints --------------------------------------------------------------------------------------------
    def model_card(self) -> dict[str, Any]:
        d = self.deployment
        return {
            "id": d.name,
            "object": "model",
            "created": self.created,
            "owned_by": "trtspec",
            "max_model_len": d.max_seq_len,
            "trtspec": d.info(),
        }

    async def health(self, scope: Any, receive: Any, send: Any) -> None:
        if self.draining:
            e = draining_error()
            await send_json(send, 503, e.body(), e.headers)
        elif await self.backend.ready(fresh=True):
            await send_json(send, 200, {"status": "ready", "model": self.deployment.name})
        else:
            await send_json(send, 503, _unavailable().body())

    # -- generation -------------------------------------------------------------------------------------------------
    async def prepare(self, kind: str, body: Any) -> Prepared:
        d = self.deployment
        r = parse_request(ChatCompletionRequest if kind == "chat" else CompletionRequest, body)
        if r.model != d.name:
            raise OpenAIError(
                404,
                f"The model '{r.model}' does not exist (this server serves '{d.name}')",
                param="model",
                code="model_not_found",
            )
        if not await self.backend.ready():
            raise _unavailable()
        if kind == "chat":
            messages = [
                {"role": "system" if m.role == "developer" else m.role, "content": message_text(m)} for m in r.messages
            ]
            check_prompt_chars("messages", sum(len(m["content"]) for m in messages), self.limits, self.max_input_len)
            try:
                prompt, n_prompt = await self.off_loop(self.tokenizer.chat_prompt, messages)
            except Exception as exc:  # noqa: BLE001 - the template refused the conversation (roles, order ...)
                raise bad_field("messages", f"cannot apply the chat template: {_first_line(exc)}") from None
            where = "messages"
        else:
            prompt = r.prompt if isinstance(r.prompt, str) else r.prompt[0]
            _rule("prompt", validate_prompt, prompt)
            check_prompt_chars("prompt", len(prompt), self.limits, self.max_input_len)
            n_prompt, where = await self.off_loop(self.tokenizer.count, prompt), "prompt"
        field_name, asked = requested_max_tokens(r)
        k_bound = d.max_draft_len if d.per_request_draft_len and d.max_draft_len else MAX_DRAFT_LEN
        check_generation_fields((field_name, asked), r.sampling(), r.num_draft_tokens, k_bound)
        if d.max_input_len:  # counted as preprocessing counts it: the same rule and words at every door
            args = (n_prompt, None, d.max_input_len, d.max_seq_len)
            _rule(where, validate_prompt_tokens, *args, code="context_length_exceeded")
        if asked is None:
            asked = COMPLETION_DEFAULT_MAX_TOKENS if kind == "completion" else d.max_seq_len - n_prompt
            asked = min(asked, d.max_seq_len - n_prompt)
            if asked < 1:
                raise bad_field(
                    where,
                    f"the prompt ({n_prompt} tokens) fills this model's context ({d.max_seq_len} tokens)",
                    code="context_length_exceeded",
                )
        else:  # the rule and words of every door (trtspec.validation.validate_prompt_tokens)
            fit = (n_prompt, asked, n_prompt, d.max_seq_len)  # the prompt's own bound is checked above
            _rule(field_name, validate_prompt_tokens, *fit, code="context_length_exceeded")
        if r.num_draft_tokens is not None and not d.per_request_draft_len:
            raise bad_field(
                "num_draft_tokens",
                "this deployment (runtime trtllm-llmapi) applies its own draft length to every request",
                code="unsupported_parameter",
            )
        stops = stop_strings(r)
        logprobs = requested_logprobs(r)
        if logprobs is not None and d.contract != "ensemble":
            raise bad_field(
                "logprobs", f"logprobs are not supported by runtime {d.runtime}", code="unsupported_parameter"
            )
        options = {
            **r.sampling(),
            "temperature": 1.0 if r.temperature is None else r.temperature,  # OpenAI's default
            "stop_words": stops or None,
            "num_draft_tokens": r.num_draft_tokens,
            "apply_chat_template": False,
        }
        from trtspec.serving.contract import request_inputs

        values = request_inputs(prompt, asked, r.stream, options)
        k = d.max_draft_len if r.num_draft_tokens is None else r.num_draft_tokens
        routed = d.contract == "ensemble" and (k == 0 or asked < d.route_threshold)
        return Prepared(kind, r, prompt, n_prompt, asked, values, stops, 0 if routed else k, routed, logprobs)

    async def run(
        self, p: Prepared, values: dict[str, Any] | None = None
    ) -> AsyncGenerator[tuple[str, dict[str, float], bool, list[Any]], None]:
        """(new text, statistics so far, finished, the log-probabilities of the tokens that arrived since the last
        piece) as the text arrives, for one choice (``values``: its request fields; default the request's); stop
        sequences are cut here (the tokens that held a stop sequence keep their log-probabilities)."""
        matcher = StopMatcher(p.stops)
        stats: dict[str, float] = {}
        lps: list[Any] = []
        try:
            async with aclosing(self.backend.generate(values or p.values, p.logprobs)) as responses:
                async for text, s, new_lps in responses:
                    stats = {**stats, **s}  # a response may leave out what an earlier one reported
                    lps += new_lps or []
                    out = matcher.feed(text)
                    if out:
                        yield out, stats, False, lps
                        lps = []
                    if matcher.stopped:
                        break  # closing the stream cancels the Triton request
        except TritonUnavailable as exc:
            raise OpenAIError(503, f"the Triton server is not available ({exc})", code="triton_unavailable") from None
        except TritonRequestError as exc:
            message = str(exc)
            if SHUTTING_DOWN_PHRASE in message:
                raise draining_error() from None
            if any(phrase in message for phrase in REQUEST_ERROR_PHRASES):
                raise OpenAIError(400, message, code="invalid_request") from None
            raise OpenAIError(500, f"generation failed: {message}", code="generation_failed") from None
        yield matcher.flush(), {**stats, "_stopped": float(matcher.stopped)}, True, lps

    def finish(self, p: Prepared, stats: dict[str, float]) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(finish_reason, usage, speculative statistics) of one finished choice."""
        completion = int(stats.get("num_output_tokens", 0))
        reason = "stop" if stats.get("_stopped") or completion < p.max_tokens else "length"
        prompt = int(stats.get("num_input_tokens") or p.prompt_tokens)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        # The LLM API's PyTorch flow may report no acceptance at all: unavailable (null), never 0.
        known = "total_draft_tokens" in stats
        spec = {
            "total_draft_tokens": int(stats["total_draft_tokens"]) if known else None,
            "total_accepted_draft_tokens": int(stats.get("total_accepted_draft_tokens", 0)) if known else None,
            "acceptance_rate": round(float(stats.get("acceptance_rate", 0.0)), 6) if known else None,
            "num_draft_tokens": p.num_draft_tokens,
            "routed_to_target": p.routed,
        }
        return reason, usage, spec

    def count(self, usage: dict[str, Any], spec: dict[str, Any]) -> None:
        """An answered request's tokens and speculation on /metrics (finish() stays a pure function)."""
        self.metrics.prompt_tokens.inc(usage["prompt_tokens"])
        self.metrics.completion_tokens.inc(usage["completion_tokens"])
        if spec["total_draft_tokens"] is not None:
            self.metrics.draft_tokens.inc(spec["total_draft_tokens"])
            self.metrics.accepted_draft_tokens.inc(spec["total_accepted_draft_tokens"])

    async def body(self, p: Prepared) -> AsyncGenerator[bytes, None]:
        """The whole response (one JSON piece), or its server-sent events."""
        chat = p.kind == "chat"
        head = {"id": ("chatcmpl-" if chat else "cmpl-") + p.id, "created": p.created, "model": self.deployment.name}
        echo = "" if chat or not p.request.echo else p.prompt

        def logprobs(items: list[Any], offset: int = 0) -> dict[str, Any] | None:
            if p.logprobs is None:
                return None
            texts = self.token_texts
            return chat_logprobs(items, texts) if chat else completion_logprobs(items, texts, offset)

        choices = choice_values(p.values, p.request.n or 1)
        if not p.request.stream:

            async def collect(values: dict[str, Any]) -> tuple[str, list[Any], dict[str, float]]:
                parts = [echo]
                every: list[Any] = []
                async with aclosing(self.run(p, values)) as stream:
                    async for text, stats, _done, lps in stream:  # noqa: B007 (stats: the last step's, read after)
                        parts.append(text)
                        every += lps
                return "".join(parts), every, stats

            results = await gather_all(collect(v) for v in choices)
            finished = [self.finish(p, stats) for _, _, stats in results]
            usage, spec = combined(finished)
            self.count(usage, spec)
            body = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs(every),
                    "finish_reason": reason,
                }
                if chat
                else {"index": i, "text": text, "logprobs": logprobs(every, len(echo)), "finish_reason": reason}
                for i, ((text, every, _), (reason, _, _)) in enumerate(zip(results, finished))
            ]
            yield json_bytes(
                {
                    **head,
                    "object": "chat.completion" if chat else "text_completion",
                    "choices": body,
                    "usage": usage,
                    "speculative_decoding": spec,
                    "system_fingerprint": None,
                }
            )
            return
        obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool(p.request.stream_options and p.request.stream_options.include_usage)
        extra = {"usage": None} if include_usage else {}

        sent = [len(echo)] * len(choices)  # characters before each choice's next token (completions' text_offset)

        def chunk(
            i: int, delta: str | None, reason: str | None = None, role: bool = False, lps: Any = None, **more: Any
        ) -> bytes:
            if chat:
                d: dict[str, Any] = (
                    {"role": "assistant", "content": ""} if role else ({} if delta is None else {"content": delta})
                )
                choice = {"index": i, "delta": d, "logprobs": lps, "finish_reason": reason}
            else:
                choice = {"index": i, "text": delta or "", "logprobs": lps, "finish_reason": reason}
            return sse({**head, "object": obj, "choices": [choice], "system_fingerprint": None, **extra, **more})

        ended: list[Any] = [None] * len(choices)
        async with merged([self.run(p, v) for v in choices]) as pieces:
            first = await pieces.__anext__()  # errors before any output get their HTTP status
            for i in range(len(choices)):
                yield chunk(i, None, role=True) if chat else chunk(i, echo) if echo else b""
            item: tuple[int, Any] | None = first
            while item is not None:
                i, (text, stats, done, lps) = item
                if text or lps:
                    yield chunk(i, text, lps=logprobs(lps, sent[i]) if lps else None)
                    if p.logprobs is not None:  # text_offset counts the tokens' own texts, as unstreamed
                        sent[i] += sum(len(self.token_texts(t.token)) for t in lps)
                if done:
                    ended[i] = self.finish(p, stats)
                    reason, _, one = ended[i]
                    yield chunk(i, None, reason, speculative_decoding=one)
                item = await anext(pieces, None)
        usage, spec = combined(ended)
        self.count(usage, spec)
        if include_usage:
            yield sse(
                {
                    **head,
                    "object": obj,
                    "choices": [],
                    "usage": usage,
                    "speculative_decoding": spec,
                    "system_fingerprint": None,
                }
            )
        yield DONE


def _rule(param: str, check: Any, *args: Any, code: str = "invalid_value") -> None:
    """A request rule of trtspec.validation, its error a 400 naming ``param``, worded as the Triton models word it."""
    try:
        check(*args)
    except GenerationError as exc:
        raise bad_field(param, error_message(exc), code=code) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _unavailable() -> OpenAIError:
    return OpenAIError(
        503, "the model is not ready: Triton is starting, stopping or unreachable", code="model_not_ready"
    )


def create_app(service: OpenAIService, api_key: str | None = None) -> Any:
    """The Starlette application behind its guard; ``api_key``: what every /v1 request must send as its Bearer."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def error(e: OpenAIError) -> Response:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers or None)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [service.model_card()]})

    async def model(request: Request) -> Response:
        if request.path_params["model"] != service.deployment.name:
            e = OpenAIError(
                404, f"The model '{request.path_params['model']}' does not exist", param="model", code="model_not_found"
            )
            return JSONResponse(e.body(), status_code=404)
        return JSONResponse(service.model_card())

    class Health:
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            await service.health(scope, receive, send)

    def generation(kind: str) -> Any:
        async def endpoint(request: Request) -> Any:
            try:
                raw = await read_body(request, service.limits.max_body_bytes)
                body = await service.off_loop(parse_body, raw, service.limits.max_json_depth)
                p = await service.prepare(kind, body)
            except OpenAIError as e:
                return error(e)
            return GenerationResponse(service.body(p), SSE if p.request.stream else JSON)

        return endpoint

    async def metrics(request: Request) -> Response:
        return Response(service.metrics.registry.render(), media_type=CONTENT_TYPE)

    async def version(request: Request) -> Response:
        from trtspec import __version__

        return JSONResponse({"version": __version__})

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        message = {
            404: f"no such endpoint: {request.method} {request.url.path}",
            405: f"method {request.method} is not allowed on {request.url.path}",
        }.get(status, str(exc))
        return JSONResponse(OpenAIError(status, message).body(), status_code=status)

    async def server_error(request: Request, exc: Exception) -> Response:
        return error(OpenAIError(500, f"internal error ({type(exc).__name__}): see the server log", code="internal"))

    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await service.backend.close()
        service.pool.shutdown(wait=False, cancel_futures=True)

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/health", Health(), methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/v1/chat/completions", generation("chat"), methods=["POST"]),
        Route("/v1/completions", generation("completion"), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=asynccontextmanager(lifespan),
    )
    return Guard(app, service, api_key)
