"""An ASGI response for generation: its status is decided by the first piece of the body, and a client that
disconnects cancels the generation (and with it the Triton request) at once, not at the next write."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from trtspec.serving.openai.protocol import OpenAIError

log = logging.getLogger("trtspec.serving.openai")

SSE = "text/event-stream"
JSON = "application/json"


def json_bytes(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def sse(data: Any) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json_bytes(data)) + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def send_json(send: Any, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
    body = json_bytes(data)
    more = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode()), *more],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class GenerationResponse:
    """Send ``body`` (bytes pieces) as ``media_type``; an OpenAIError raised before the first piece is answered with
    its status and OpenAI's error body, one raised later (while streaming) as an ``error`` event."""

    def __init__(self, body: AsyncIterator[bytes], media_type: str) -> None:
        self.body = body
        self.media_type = media_type

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        produce = asyncio.ensure_future(self._produce(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({produce, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (produce, watch):
                if not task.done():
                    task.cancel()  # a disconnect cancels the producer: its Triton request is cancelled
            await asyncio.gather(produce, watch, return_exceptions=True)
            await _aclose(self.body)
        if not produce.cancelled() and produce.exception() is not None:
            raise produce.exception()  # type: ignore[misc]

    async def _produce(self, send: Any) -> None:
        started = False
        try:
            async for piece in self.body:
                if not started:
                    headers = [(b"content-type", self.media_type.encode())]
                    if self.media_type == SSE:
                        headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    started = True
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        except Exception as exc:  # noqa: BLE001 - every failure reaches the client in OpenAI's shape
            if not isinstance(exc, OpenAIError):
                log.exception("generation failed")
                exc = OpenAIError(500, f"generation failed ({type(exc).__name__}): see the server log", code="internal")
            if not started:
                await send_json(send, exc.status, exc.body(), exc.headers)
                return
            await send({"type": "http.response.body", "body": sse(exc.body()) + DONE, "more_body": True})
        if not started:
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", self.media_type.encode())]}
            )
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _aclose(body: Any) -> None:
    close = getattr(body, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:  # noqa: BLE001 - closing a finished or cancelled generator
            pass
