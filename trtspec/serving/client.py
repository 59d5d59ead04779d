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
from trtspec.serving.endpoints import parse_url, probe, stream_error

STAT_NAMES = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "num_input_tokens",
              "num_output_tokens")
# ensemble field -> llmapi model input (trtspec.triton_repo.tensors.LLMAPI_INPUTS)
LLMAPI_FIELDS = {"text_input": "text_input", "max_tokens": "sampling_param_max_tokens", "stream": "streaming",
                 "temperature": "sampling_param_temperature", "top_k": "sampling_param_top_k",
                 "top_p": "sampling_param_top_p", "seed": "sampling_param_seed",
                 "exclude_input_in_output": "sampling_param_exclude_input_from_output",
                 "stop_words": "sampling_param_stop", "return_perf_metrics": "sampling_param_return_perf_metrics",
                 "apply_chat_template": "apply_chat_template"}
LLMAPI_STATS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "num_output_tokens")
LLMAPI_MODEL = "tensorrt_llm"


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
        return {"text": self.text, "stats": self.stats, "chunks": len(self.chunks),
                "ttft_s": self.ttft_s, "latency_s": round(self.latency_s, 4)}


def _input_types(contract: str = "ensemble") -> dict[str, str]:
    from trtspec.triton_repo.tensors import ENSEMBLE_INPUTS, LLMAPI_INPUTS

    return {t.name: t.dtype for t in (LLMAPI_INPUTS if contract == "llmapi" else ENSEMBLE_INPUTS)}


def llmapi_inputs(values: dict[str, Any]) -> dict[str, Any]:
    """Ensemble request fields as the llmapi model's inputs; a field it has no input for is an error."""
    unsupported = sorted(set(values) - set(LLMAPI_FIELDS))
    if unsupported == ["num_draft_tokens"] and values["num_draft_tokens"] == 0:
        raise GenerationError("the trtllm-llmapi model cannot skip the draft per request (num_draft_tokens 0)",
                              hint="the LLM API applies the deployment's speculative_config to every request")
    if unsupported:
        raise GenerationError(f"request field {unsupported[0]!r} is not supported by the trtllm-llmapi model",
                              hint=f"supported: {', '.join(sorted(LLMAPI_FIELDS))}")
    return {LLMAPI_FIELDS[k]: v for k, v in values.items()}


def request_inputs(prompt: str | bytes, max_tokens: int, stream: bool, options: dict[str, Any]) -> dict[str, Any]:
    """The ensemble inputs for one request (None-valued options are left out)."""
    values: dict[str, Any] = {"text_input": prompt, "max_tokens": int(max_tokens), "stream": bool(stream),
                              "exclude_input_in_output": True}
    values.update({k: v for k, v in options.items() if v is not None})
    known = _input_types()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise GenerationError(f"unknown request field {unknown[0]!r}", hint=f"known: {', '.join(sorted(known))}")
    from trtspec.validation import validate_fields

    validate_fields(values)  # the rules every path applies, before anything is sent
    return values


class TritonLLMClient:
    """Send prompts to ``model`` (default ``ensemble``) at ``url`` (host:port), one request at a time per client
    (use one client per thread for concurrent requests)."""

    def __init__(self, url: str, protocol: str | None = None, model: str = "ensemble",
                 timeout_s: float = 600.0) -> None:
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
        try:
            if self.protocol == "http":
                index = self._get_json("/v2/repository/index", data=b"{}")
            else:
                index = self._grpc_client().get_model_repository_index(as_json=True).get("models", [])
            return sorted(m["name"] for m in index if m.get("state") == "READY")
        except Exception:  # noqa: BLE001
            return []

    def deployment_parameters(self, model: str = "tensorrt_llm_bls") -> dict[str, str]:
        """The string parameters of a served model's config (the orchestrator's: max_draft_len, route_threshold);
        empty when the server has no such model (runtime trtllm-llmapi) or does not say."""
        try:
            if self.protocol == "http":
                config = self._get_json(f"/v2/models/{model}/config")
            else:
                config = self._grpc_client().get_model_config(model, as_json=True).get("config", {})
            return {k: str(v.get("string_value", "")) for k, v in (config.get("parameters") or {}).items()}
        except Exception:  # noqa: BLE001
            return {}

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
            raise ServerError(f"{self.url} accepts connections but does not answer {self.protocol.upper()} as a "
                              "Triton server", hint=f"is this its {other} port? by default gRPC is 8001 and HTTP "
                              "8000; give the right port, or http:// / grpc:// in --url")
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
            raise ServerError(f"the server at {self.endpoint.url} has no ready model {self.model!r}"
                              + (f" (ready: {', '.join(ready)})" if ready else " (no model is ready)"),
                              hint="serve a repository written by `trtspec repo`; the server log says why a model "
                                   "did not load")

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
            self.contract = "ensemble"
            inputs = self._model_inputs(self.model)
            if inputs is None and self.model == "ensemble":
                alt = self._model_inputs(LLMAPI_MODEL)
                if alt is not None and "sampling_param_max_tokens" in alt:
                    self.model, self.contract = LLMAPI_MODEL, "llmapi"
            elif inputs is not None and "sampling_param_max_tokens" in inputs:
                self.contract = "llmapi"
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
    def generate(self, prompt: str | bytes, max_tokens: int, *, stream: bool = False,
                 on_text: Callable[[str], None] | None = None, **options: Any) -> GenerateResult:
        """One prompt; with ``stream`` the text arrives in several responses (``on_text`` sees each chunk)."""
        values = request_inputs(prompt, max_tokens, stream, options)
        if self._resolve_contract() == "llmapi":
            values = llmapi_inputs(values)
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
        import numpy as np
        import tritonclient.grpc as grpcclient

        client = self._grpc_client()
        llmapi = self.contract == "llmapi"
        types = _input_types(self.contract or "ensemble")
        inputs = []
        for name, value in values.items():
            dtype = types[name]
            if dtype == "STRING":
                items = value if isinstance(value, (list, tuple)) else [value]
                arr = np.array([v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in items],
                               dtype=np.object_)
                dtype = "BYTES"
            else:
                np_type = {"INT32": np.int32, "UINT64": np.uint64, "FP32": np.float32, "BOOL": np.bool_}[dtype]
                arr = np.array([value], dtype=np_type)
            if not llmapi:
                arr = arr[None]  # the ensemble batches: [1, ...]
            x = grpcclient.InferInput(name, list(arr.shape), dtype)
            x.set_data_from_numpy(arr)
            inputs.append(x)
        request_id = uuid.uuid4().hex
        stat_names = LLMAPI_STATS if llmapi else STAT_NAMES
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("text_output", *stat_names)]
        client.async_stream_infer(self.model, inputs, outputs=outputs, request_id=request_id,
                                  enable_empty_final_response=True)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                result, error = self._responses.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise ServerError(f"no response from {self.endpoint.url} within {self.timeout_s:.0f} s",
                                  hint="the server may be overloaded or a model hung: read its log, or raise the "
                                       "timeout") from None
            if error is not None:
                raise stream_error(error, self.endpoint.url)
            response = result.get_response()
            if response.id and response.id != request_id:
                continue  # a late response of an earlier request on this stream
            text_out = result.as_numpy("text_output")
            if text_out is not None:
                text = b"".join(bytes(t) for t in text_out.reshape(-1)).decode("utf-8", errors="replace")
                stats = {}
                for n in stat_names:
                    v = result.as_numpy(n)
                    if v is not None:
                        stats[n] = float(v.reshape(-1)[0]) if n == "acceptance_rate" else int(v.reshape(-1)[0])
                yield text, stats
            final = response.parameters.get("triton_final_response")
            if final is None or final.bool_param:
                return

    def _http_chunks(self, values: dict[str, Any], stream: bool) -> Iterator[tuple[str, dict]]:
        body = dict(values)
        if isinstance(body["text_input"], bytes):
            body["text_input"] = body["text_input"].decode("utf-8")  # JSON carries text only
        endpoint = "generate_stream" if stream else "generate"
        import http.client

        req = urllib.request.Request(f"{self._http_base}/v2/models/{self.model}/{endpoint}",
                                     data=json.dumps(body).encode("utf-8"),
                                     headers={"Content-Type": "application/json"})
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise GenerationError(f"server: {_http_error(exc)}",
                                  hint="the server refused this request; its log has details") from None
        except urllib.error.URLError as exc:
            probe(self.endpoint)  # connection refused / unresolvable: the precise message
            raise ServerError(f"cannot reach {self.endpoint.url} ({exc.reason})",
                              hint="start the server with `trtspec serve`") from None
        with resp:
            try:
                if not stream:
                    yield _http_payload(json.loads(resp.read().decode("utf-8")))
                    return
                for raw in resp:
                    line = raw.decode("utf-8").strip()
                    if line.startswith("data:"):
                        yield _http_payload(json.loads(line[5:].strip()))
            except (http.client.IncompleteRead, ConnectionError, TimeoutError) as exc:
                raise ServerError(f"the server at {self.endpoint.url} dropped the connection mid-request "
                                  f"({type(exc).__name__})", hint="the server stopped or a model crashed: its log "
                                  "(trtspec serve --log-file) says why") from None


def _http_error(exc: urllib.error.HTTPError) -> str:
    """The server's message: a JSON body, or a server-sent event (``data: {...}``) from generate_stream."""
    try:
        body = exc.read().decode("utf-8").strip()
        if body.startswith("data:"):
            body = body[5:].strip()
        return str(json.loads(body).get("error", exc.reason))
    except Exception:  # noqa: BLE001
        return str(exc.reason)


def _http_payload(data: dict[str, Any]) -> tuple[str, dict]:
    if "error" in data:
        raise GenerationError(f"server: {data['error']}", hint="the server refused this request; its log has details")
    text = data.get("text_output", "")
    if isinstance(text, list):
        text = "".join(text)
    stats = {}
    for n in STAT_NAMES:
        if n in data:
            v = data[n][0] if isinstance(data[n], list) else data[n]
            stats[n] = float(v) if n == "acceptance_rate" else int(v)
    return text, stats
