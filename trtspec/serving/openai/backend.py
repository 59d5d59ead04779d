"""The frontend's way to Triton: tritonclient's asyncio gRPC client, one bidirectional stream per request.

A stream serves decoupled (streaming) and plain models alike. Leaving ``generate`` early (the HTTP client went away,
a stop sequence was found) cancels the gRPC call, which cancels the request in Triton.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from trtspec.serving.contract import grpc_inputs, grpc_outputs, result_payload, translate


class TritonRequestError(Exception):
    """Triton answered the request with an error (its message)."""


class TritonUnavailable(Exception):
    """Triton cannot be reached, or is not ready."""


class TritonBackend:
    """Requests to ``model`` (speaking ``contract``) on the Triton server at ``url`` (host:port, gRPC)."""

    def __init__(self, url: str, model: str, contract: str, ready_cache_s: float = 1.0) -> None:
        self.url = url
        self.model = model
        self.contract = contract
        self.ready_cache_s = ready_cache_s
        self._client: Any = None
        self._ready_at = 0.0
        self._ready = False

    def _grpc(self) -> Any:
        if self._client is None:  # created on the serving event loop: grpc.aio channels belong to one loop
            import tritonclient.grpc.aio as grpcaio

            self._client = grpcaio.InferenceServerClient(self.url)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    async def ready(self, fresh: bool = False) -> bool:
        """Server and model ready (cached for ``ready_cache_s`` unless ``fresh``)."""
        now = time.monotonic()
        if fresh or now - self._ready_at > self.ready_cache_s:
            try:
                client = self._grpc()
                ok = bool(await client.is_server_ready(client_timeout=2.0)) and \
                    bool(await client.is_model_ready(self.model, client_timeout=2.0))
            except Exception:  # noqa: BLE001 - unreachable is not ready
                ok = False
            self._ready, self._ready_at = ok, time.monotonic()
        return self._ready

    async def generate(self, values: dict[str, Any]) -> AsyncIterator[tuple[str, dict[str, float]]]:
        """(text, statistics) per response for one request in ensemble field names."""
        import grpc

        inputs = grpc_inputs(translate(values, self.contract), self.contract)
        request = {"model_name": self.model, "inputs": inputs, "outputs": grpc_outputs(self.contract),
                   "request_id": uuid.uuid4().hex}

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield request  # then the client half-closes: the stream ends after the request's last response

        stream = self._grpc().stream_infer(one_request())
        try:
            async for result, error in stream:
                if error is not None:
                    raise TritonRequestError(_message(error))
                payload = result_payload(result, self.contract)
                if payload is not None:
                    yield payload
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._ready_at = 0.0
                raise TritonUnavailable(exc.details() or str(exc.code())) from None
            if exc.code() == grpc.StatusCode.CANCELLED:
                raise asyncio.CancelledError() from None
            raise TritonRequestError(exc.details() or str(exc.code())) from None
        finally:
            stream.cancel()  # a no-op for a finished call; otherwise Triton cancels the request


def _message(error: Any) -> str:
    message = getattr(error, "message", None)
    return str(message() if callable(message) else error)
