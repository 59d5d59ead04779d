"""The OpenAI frontend's door (an ASGI middleware around the app): what every request passes before any endpoint runs.

- ``X-Request-Id``: the client's (when it is a short printable token) or a new one, echoed on every response.
- The API key: with one set, every ``/v1`` request needs ``Authorization: Bearer KEY`` (what OpenAI's clients send
  from ``api_key``), else 401; ``/health``, ``/metrics`` and ``/version`` stay open for probes and scrapers, as vLLM's.
- A drain: every ``/v1`` request gets 503 with ``Retry-After`` (a balancer sends it elsewhere); /health says not ready.
- ``POST`` needs ``Content-Type: application/json`` (415 otherwise): a web page can send a cross-origin "simple"
  request (text/plain, form) without a CORS preflight, but not a JSON one, so a page a user opens cannot start
  generations on a server on localhost. No CORS headers are sent, so browsers keep other origins' scripts out.
- Metrics: requests by endpoint and status, their latency, and those in flight (trtspec.serving.metrics).
"""

from __future__ import annotations

import hmac
import re
import time
import uuid
from typing import Any

from trtspec.serving.metrics import Registry
from trtspec.serving.openai.asgi import send_json
from trtspec.serving.openai.protocol import OpenAIError

REQUEST_ID = "x-request-id"
_REQUEST_ID_OK = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
RETRY_AFTER_S = 5  # during a drain: ask clients to come back after the balancer has moved them on
OPEN_PATHS = ("/health", "/metrics", "/version")
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/version")


def draining_error() -> OpenAIError:
    return OpenAIError(
        503,
        "the server is shutting down and admits no new requests: retry on another replica",
        code="server_shutting_down",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


def _header(scope: Any, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class RequestMetrics:
    """The frontend's own metrics, in a registry others may add to."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.requests = registry.counter(
            "trtspec_openai_requests_total", "HTTP requests answered, by endpoint and status", ("endpoint", "status")
        )
        self.latency = registry.histogram(
            "trtspec_openai_request_duration_seconds",
            "time from a request's arrival to the end of its response (the whole stream), by endpoint",
            ("endpoint",),
        )
        self.in_flight = registry.gauge("trtspec_openai_requests_in_flight", "requests being answered now")
        self.prompt_tokens = registry.counter(
            "trtspec_openai_prompt_tokens_total", "prompt tokens of answered requests"
        )
        self.completion_tokens = registry.counter(
            "trtspec_openai_completion_tokens_total", "tokens generated for answered requests"
        )
        # Speculation on production traffic, from the statistics each response carries (the serving models' own
        # counters, with target steps and the K chosen, are on Triton's /metrics: trtspec.triton_repo.spec_metrics).
        self.draft_tokens = registry.counter(
            "trtspec_openai_draft_tokens_total", "draft tokens proposed for answered requests"
        )
        self.accepted_draft_tokens = registry.counter(
            "trtspec_openai_accepted_draft_tokens_total", "draft tokens the target accepted for answered requests"
        )


class Guard:
    """The middleware; ``service`` gives ``draining`` (a bool attribute) and ``metrics`` (RequestMetrics)."""

    def __init__(self, app: Any, service: Any, api_key: str | None = None) -> None:
        self.app = app
        self.service = service
        self.api_key = api_key or None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, REQUEST_ID.encode())
        request_id = given if given and _REQUEST_ID_OK.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else ("/v1/models/{model}" if path.startswith("/v1/models/") else "other")
        status = [0]

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
                headers = [h for h in message.get("headers") or () if h[0].lower() != REQUEST_ID.encode()]
                message = {**message, "headers": [*headers, (REQUEST_ID.encode(), request_id.encode("latin-1"))]}
            await send(message)

        metrics = self.service.metrics
        t0 = time.perf_counter()
        metrics.in_flight.inc()
        try:
            refusal = self._refusal(scope, path)
            if refusal is not None:
                await send_json(send_with_id, refusal.status, refusal.body(), refusal.headers)
            else:
                await self.app(scope, receive, send_with_id)
        finally:
            metrics.in_flight.dec()
            metrics.requests.inc(endpoint=endpoint, status=str(status[0] or 500))
            metrics.latency.observe(time.perf_counter() - t0, endpoint=endpoint)

    def _refusal(self, scope: Any, path: str) -> OpenAIError | None:
        if path in OPEN_PATHS or not path.startswith("/v1"):
            return None
        if self.api_key is not None:
            auth = _header(scope, b"authorization") or ""
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
                return OpenAIError(
                    401,
                    "Incorrect API key provided."
                    if auth
                    else "You didn't provide an API key: send "
                    "'Authorization: Bearer YOUR_KEY' (OpenAI clients do it from api_key)",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        if self.service.draining:
            return draining_error()
        if scope.get("method") == "POST":
            kind = (_header(scope, b"content-type") or "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                return OpenAIError(
                    415,
                    f"the request body must be JSON with 'Content-Type: application/json' (got {kind or 'none'!r})",
                    code="unsupported_media_type",
                )
        return None
