"""A client for the repository's ``ensemble`` (the TRT-LLM ensemble contract) over gRPC (streaming) or HTTP.

A repository of runtime trtllm-llmapi has no ensemble: its one model, ``tensorrt_llm``, takes TensorRT-LLM's llmapi
contract (``sampling_param_*`` names, no batch dimension). The client finds out which one the server has on its
first request and translates the same request fields.

gRPC uses the bidirectional stream, which serves decoupled (streaming) and plain models alike. HTTP uses Triton's
generate extension (``/generate``, and ``/generate_stream`` with server-sent events), which decoupled models need.
"""

from __future__ import annotations

import json
import queue
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trtspec.errors import GenerationError, ServerError
from trtspec.serving.contract import (
    LLMAPI_FIELDS,
    LLMAPI_STATS,
    STAT_NAMES,
    contract_of,
    grpc_inputs,
    grpc_outputs,
    json_payload,
    llmapi_inputs,
    request_inputs,
    result_payload,
    translate,
)
from trtspec.serving.endpoints import PROTOCOLS, parse_url, probe, stream_error
from trtspec.triton_repo.names import ENSEMBLE, LLMAPI

# Re-exported: the translation lives in trtspec.serving.contract, shared with the OpenAI frontend and the bench.
__all__ = [
    "STAT_NAMES",
    "LLMAPI_FIELDS",
    "LLMAPI_STATS",
    "PROTOCOLS",
    "GenerateResult",
    "TritonLLMClient",
    "llmapi_inputs",
    "request_inputs",
]


@dataclass
class GenerateResult:
    """The answer to one prompt: text, per-response chunks, statistics, timings (seconds since the request)."""

    text: str
    chunks: list[str] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)
    chunk_times: list[float] = field(default_factory=list)
    latency_s: float = 0.0

    @property
    def ttft_s(self) -> float | None:
        """Time to the first non-empty chunk."""
        return next((t for t, c in zip(self.chunk_times, self.chunks) if c), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "stats": self.stats,
            "chunks": len(self.chunks),
            "ttft_s": self.ttft_s,
            "latency_s": round(self.latency_s, 4),
        }


class TritonLLMClient:
    """Send prompts to ``model`` (default ``ensemble``) at ``url`` (host:port), one request at a time per client
    (use one client per thread for concurrent requests)."""

    def __init__(self, url: str, protocol: str | None = None, model: str = ENSEMBLE, timeout_s: float = 600.0) -> None:
        self.endpoint = parse_url(url, protocol)
        self.url = self.endpoint.address
        self.protocol = self.endpoint.protocol
        self.model = model
        self.contract: str | None = None  # "ensemble" | "llmapi", found on the first request
        self.timeout_s = timeout_s
        self._grpc: Any = None
        self._responses: queue.Queue = queue.Queue()

    @property
    def _http_base(self) -> str:
        return f"{'https' if self.endpoint.tls else 'http'}://{self.url}"

    # -- connection ---------------------------------------------------------------------------------------------
    def _grpc_client(self) -> Any:
        if self._grpc is None:
            from trtspec.errors import require

            require("tritonclient", "serve")
            import tritonclient.grpc as grpcclient

            self._grpc = grpcclient.InferenceServerClient(self.url)
            self._grpc.start_stream(callback=lambda result, error: self._responses.put((result, error)))
        return self._grpc

    def _get_json(self, path: str, data: bytes | None = None) -> Any:
        req = urllib.request.Request(f"{self._http_base}{path}", data=data)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read().decode("utf-8") or "null")

    def _server_live(self) -> bool:
        try:
            if self.protocol == "http":
                with urllib.request.urlopen(f"{self._http_base}/v2/health/live", timeout=10) as r:
                    return r.status == 200
            import tritonclient.grpc as grpcclient

            with grpcclient.InferenceServerClient(self.url) as probe_client:  # not the streaming client
                return bool(probe_client.is_server_live(client_timeout=10))
        except Exception:  # noqa: BLE001 - not a Triton server speaking this protocol
            return False

    def _ready_models(self) -> list[str]:
        """The ready models: the repository index where the server shows it, else (a trtspec server keeps the
        repository API behind its key) those of a trtspec repository's names that answer ready."""
        try:
            if self.protocol == "http":
                index = self._get_json("/v2/repository/index", data=b"{}")
            else:
                index = self._grpc_client().get_model_repository_index(as_json=True).get("models", [])
            return sorted(m["name"] for m in index if m.get("state") == "READY")
        except Exception:  # noqa: BLE001 - restricted or unavailable: ask the names a trtspec repository uses
            pass
        from trtspec.triton_repo.names import BLS, DRAFT, ENSEMBLE, POST, PRE, TARGET

        ready = []
        for name in (ENSEMBLE, PRE, POST, BLS, TARGET, DRAFT):
            try:
                if self.protocol == "http":
                    with urllib.request.urlopen(f"{self._http_base}/v2/models/{name}/ready", timeout=5) as r:
                        ok = r.status == 200
                else:
                    ok = bool(self._grpc_client().is_model_ready(name))
            except Exception:  # noqa: BLE001 - not served
                ok = False
            if ok:
                ready.append(name)
        return sorted(ready)

    def model_config(self, model: str) -> dict[str, Any] | None:
        """A served model's config as JSON (Triton's ``/v2/models/<model>/config``); None when the server has no
        such model or cannot say."""
        try:
            if self.protocol == "http":
                return self._get_json(f"/v2/models/{model}/config")
            return self._grpc_client().get_model_config(model, as_json=True).get("config", {})
        except Exception:  # noqa: BLE001 - an unknown model is tritonclient's InferenceServerException or HTTP 400
            return None

    def model_parameters(self, model: str) -> dict[str, str]:
        """The string parameters of a served model's config; empty when the server has no such model."""
        config = self.model_config(model) or {}
        return {k: str(v.get("string_value", "")) for k, v in (config.get("parameters") or {}).items()}

    def deployment_parameters(self) -> dict[str, str]:
        """The draft-target settings of the served repository (max_draft_len, route_threshold ...), from the
        orchestrator or the in-process target model; empty when the server does not say (runtime trtllm-llmapi)."""
        from trtspec.triton_repo.names import DRAFT_TARGET_MODELS, draft_target_params

        return draft_target_params({m: self.model_parameters(m) for m in DRAFT_TARGET_MODELS})

    def max_draft_len(self) -> int | None:
        """The deployment's K bound (the orchestrator's max_draft_len), or None when the server does not say."""
        value = self.deployment_parameters().get("max_draft_len", "")
        return int(value) if value.isdigit() else None

    def check_ready(self) -> None:
        """Raise ServerError unless a Triton server answers at the endpoint and the model is ready; the message
        says which: nothing listening, another protocol on that port, or no such ready model."""
        if self.protocol == "grpc":
            from trtspec.errors import require

            require("tritonclient", "serve")
        probe(self.endpoint)
        if not self._server_live():
            other = "HTTP" if self.protocol == "grpc" else "gRPC"
            raise ServerError(
                f"{self.url} accepts connections but does not answer {self.protocol.upper()} as a Triton server",
                hint=f"is this its {other} port? by default gRPC is 8001 and HTTP "
                "8000; give the right port, or http:// / grpc:// in --url",
            )
        self._resolve_contract()
        ok = False
        try:
            if self.protocol == "http":
                with urllib.request.urlopen(f"{self._http_base}/v2/models/{self.model}/ready", timeout=10) as r:
                    ok = r.status == 200
            else:
                ok = bool(self._grpc_client().is_model_ready(self.model))
        except Exception:  # noqa: BLE001 - unknown or unloaded model: the same message
            ok = False
        if not ok:
            ready = self._ready_models()
            raise ServerError(
                f"the server at {self.endpoint.url} has no ready model {self.model!r}"
                + (f" (ready: {', '.join(ready)})" if ready else " (no model is ready)"),
                hint="serve a repository written by `trtspec repo`; the server log says why a model did not load",
            )

    def _model_inputs(self, model: str) -> set[str] | None:
        """The input names of ``model`` on the server, or None when it has no such model."""
        try:
            if self.protocol == "http":
                with urllib.request.urlopen(f"{self._http_base}/v2/models/{model}", timeout=10) as r:
                    meta = json.loads(r.read().decode("utf-8"))
            else:
                meta = self._grpc_client().get_model_metadata(model, as_json=True)
        except Exception:  # noqa: BLE001 - unknown model or unreachable server: the request reports it
            return None
        return {i["name"] for i in meta.get("inputs", [])}

    def _resolve_contract(self) -> str:
        if self.contract is None:
            found = contract_of(self._model_inputs(self.model))
            if found is None and self.model == ENSEMBLE and contract_of(self._model_inputs(LLMAPI)) == "llmapi":
                self.model, found = LLMAPI, "llmapi"  # an llmapi repository has no ensemble
            self.contract = found or "ensemble"
        return self.contract

    def close(self) -> None:
        if self._grpc is not None:
            try:
                self._grpc.stop_stream()
            finally:
                self._grpc.close()
                self._grpc = None

    def __enter__(self) -> TritonLLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- generation ---------------------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | bytes,
        max_tokens: int,
        *,
        stream: bool = False,
        on_text: Callable[[str], None] | None = None,
        **options: Any,
    ) -> GenerateResult:
        """One prompt; with ``stream`` the text arrives in several responses (``on_text`` sees each chunk)."""
        values = translate(request_inputs(prompt, max_tokens, stream, options), self._resolve_contract())
        t0 = time.perf_counter()
        result = GenerateResult(text="")
        chunks = self._grpc_chunks(values) if self.protocol == "grpc" else self._http_chunks(values, stream)
        for text, stats in chunks:
            result.chunks.append(text)
            result.chunk_times.append(time.perf_counter() - t0)
            if stats:
                result.stats = stats
            if on_text is not None and text:
                on_text(text)
        result.text = "".join(result.chunks)
        result.latency_s = time.perf_counter() - t0
        return result

    def _grpc_chunks(self, values: dict[str, Any]) -> Iterator[tuple[str, dict]]:
        client = self._grpc_client()
        contract = self.contract or "ensemble"
        inputs = grpc_inputs(values, contract)
        request_id = uuid.uuid4().hex
        client.async_stream_infer(
            self.model, inputs, outputs=grpc_outputs(contract), request_id=request_id, enable_empty_final_response=True
        )
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                result, error = self._responses.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise ServerError(
                    f"no response from {self.endpoint.url} within {self.timeout_s:.0f} s",
                    hint="the server may be overloaded or a model hung: read its log, or raise the timeout",
                ) from None
            if error is not None:
                raise stream_error(error, self.endpoint.url)
            response = result.get_response()
            if response.id and response.id != request_id:
                continue  # a late response of an earlier request on this stream
            payload = result_payload(result, contract)
            if payload is not None:
                yield payload
            final = response.parameters.get("triton_final_response")
            if final is None or final.bool_param:
                return

    def _http_chunks(self, values: dict[str, Any], stream: bool) -> Iterator[tuple[str, dict]]:
        import http.client

        body = dict(values)
        if isinstance(body["text_input"], bytes):
            body["text_input"] = body["text_input"].decode("utf-8")  # JSON carries text only
        endpoint = "generate_stream" if stream else "generate"
        req = urllib.request.Request(
            f"{self._http_base}/v2/models/{self.model}/{endpoint}",
            data=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json"},
        )
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise GenerationError(
                f"server: {_http_error(exc)}", hint="the server refused this request; its log has details"
            ) from None
        except urllib.error.URLError as exc:
            probe(self.endpoint)  # connection refused / unresolvable: the precise message
            raise ServerError(
                f"cannot reach {self.endpoint.url} ({exc.reason})", hint="start the server with `trtspec serve`"
            ) from None
        with resp:
            try:
                if not stream:
                    yield json_payload(json.loads(resp.read().decode("utf-8")))
                    return
                for raw in resp:
                    line = raw.decode("utf-8").strip()
                    if line.startswith("data:"):
                        yield json_payload(json.loads(line[5:].strip()))
            except (http.client.IncompleteRead, ConnectionError, TimeoutError) as exc:
                raise ServerError(
                    f"the server at {self.endpoint.url} dropped the connection mid-request ({type(exc).__name__})",
                    hint="the server stopped or a model crashed: its log (trtspec serve --log-file) says why",
                ) from None


def _http_error(exc: urllib.error.HTTPError) -> str:
    """The server's message: a JSON body, or a server-sent event (``data: {...}``) from generate_stream."""
    try:
        body = exc.read().decode("utf-8").strip()
        if body.startswith("data:"):
            body = body[5:].strip()
        return str(json.loads(body).get("error", exc.reason))
    except Exception:  # noqa: BLE001
        return str(exc.reason)
