"""The two ways `trtspec bench` reaches a deployment: Triton's own protocol (gRPC or HTTP, trtspec's client) or the
OpenAI-compatible API (streamed server-sent events, stdlib HTTP). Both stream every request, so time to first token
and inter-token latency are measured as clients see them, and both return the same Record."""

from __future__ import annotations

import http.client
import json
import queue
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from trtspec.errors import GenerationError, ServerError


@dataclass
class Record:
    """One finished request as the client saw it (seconds since it was sent)."""

    tokens: int = 0
    input_tokens: int = 0
    ttft: float | None = None
    itl: float | None = None  # mean time per output token after the first
    latency: float = 0.0
    drafted: int = 0
    accepted: int = 0
    routed: bool = False
    has_acceptance: bool = False  # the server reported draft statistics (the LLM API may not)
    error: str | None = None


def _record(
    chunk_times: list[float], chunks: list[str], latency: float, stats: dict[str, Any], routed: bool | None = None
) -> Record:
    n = int(stats.get("num_output_tokens", 0))
    times = [t for t, c in zip(chunk_times, chunks) if c]
    known = stats.get("total_draft_tokens") is not None
    drafted = int(stats["total_draft_tokens"]) if known else 0
    return Record(
        tokens=n,
        input_tokens=int(stats.get("num_input_tokens", 0)),
        ttft=times[0] if times else None,
        itl=(times[-1] - times[0]) / (n - 1) if n > 1 and len(times) > 1 else None,
        latency=latency,
        drafted=drafted,
        accepted=int(stats.get("total_accepted_draft_tokens") or 0),
        routed=(known and drafted == 0) if routed is None else routed,
        has_acceptance=known,
    )


class TritonRequester:
    """Streamed requests through Triton's protocol; a pool of clients shared by the benchmark's threads."""

    protocol: str

    def __init__(self, url: str, protocol: str | None = None) -> None:
        from trtspec.serving.client import TritonLLMClient

        self._make = lambda: TritonLLMClient(url, protocol=protocol)
        self._pool: queue.SimpleQueue = queue.SimpleQueue()
        first = self._make()
        self.url, self.protocol = url, first.protocol  # None: the URL's scheme, else gRPC
        first.check_ready()
        self.contract = first.contract or "ensemble"
        self._pool.put(first)

    def describe(self) -> dict[str, Any]:
        """The deployment as Triton's model configs tell it: runtime, default K, route threshold."""
        from trtspec.triton_repo.names import BLS, ENSEMBLE, LLMAPI, TARGET, draft_target_params

        if self.contract == "llmapi":
            return {
                "model": LLMAPI,
                "runtime": "trtllm-llmapi",
                "max_draft_len": None,
                "route_threshold": 0,
                "per_request_draft_len": False,
            }
        engine = self._config(TARGET) or {}
        bls = draft_target_params({BLS: _params(self._config(BLS)), TARGET: _params(engine)})
        return {
            "model": ENSEMBLE,
            "runtime": "trtllm-engine" if engine.get("backend") == "tensorrtllm" else "torch",
            "max_draft_len": int(bls.get("max_draft_len", 0)) or None,
            "route_threshold": int(bls.get("route_threshold", 0)),
            "per_request_draft_len": True,
        }

    def _config(self, model: str) -> dict[str, Any] | None:
        try:
            client = self._pool.get_nowait()
        except queue.Empty:
            client = self._make()
        try:
            return client.model_config(model)
        finally:
            self._pool.put(client)

    def send(self, prompt: str, max_tokens: int, k: int | None, chat: bool) -> Record:
        try:
            client = self._pool.get_nowait()
        except queue.Empty:
            client = self._make()
        try:
            r = client.generate(
                prompt, max_tokens, stream=True, apply_chat_template=chat, num_draft_tokens=k, temperature=0.0
            )
        except Exception as exc:  # noqa: BLE001 - counted and reported; the client is not reused
            client.close()
            return Record(error=str(exc))
        self._pool.put(client)
        return _record(r.chunk_times, r.chunks, r.latency_s, r.stats)

    def close(self) -> None:
        while not self._pool.empty():
            self._pool.get_nowait().close()


class OpenAIRequester:
    """Streamed requests to an OpenAI-compatible server (``/v1/chat/completions``, or ``/v1/completions`` for raw
    prompts), usage and trtspec's ``speculative_decoding`` extension read from the last chunk."""

    protocol = "openai"

    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        url = base_url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        self.url = self.base_url
        self.timeout_s = timeout_s
        try:
            with urllib.request.urlopen(self.base_url + "/models", timeout=10) as r:
                models = json.loads(r.read().decode("utf-8"))["data"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            raise ServerError(
                f"no OpenAI-compatible server at {self.base_url} ({exc})",
                hint="start one with `trtspec serve REPO --openai-port PORT`",
            ) from None
        if not models:
            raise ServerError(f"{self.base_url}/models lists no model", hint="is the server still loading?")
        self.card = models[0]
        self.model = self.card["id"]
        self.contract = (self.card.get("trtspec") or {}).get("contract", "ensemble")

    def describe(self) -> dict[str, Any]:
        info = self.card.get("trtspec") or {}
        return {
            "model": self.model,
            "runtime": info.get("runtime", "unknown"),
            "max_draft_len": info.get("max_draft_len"),
            "route_threshold": int(info.get("route_threshold") or 0),
            "per_request_draft_len": bool(info.get("per_request_draft_len", True)),
        }

    def send(self, prompt: str, max_tokens: int, k: int | None, chat: bool) -> Record:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if k is not None:
            body["num_draft_tokens"] = k
        parts = urllib.parse.urlsplit(self.base_url + ("/chat/completions" if chat else "/completions"))
        conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(parts.netloc, timeout=self.timeout_s)
        t0 = time.perf_counter()
        chunks: list[str] = []
        times: list[float] = []
        stats: dict[str, Any] = {}
        routed = None
        try:
            conn.request("POST", parts.path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise GenerationError(f"HTTP {resp.status}: {_error_message(resp.read())}")
            for raw in resp:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise GenerationError(f"server: {event['error'].get('message')}")
                for choice in event.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                    if text:
                        chunks.append(text)
                        times.append(time.perf_counter() - t0)
                if event.get("usage"):
                    stats["num_output_tokens"] = event["usage"]["completion_tokens"]
                    stats["num_input_tokens"] = event["usage"]["prompt_tokens"]
                spec = event.get("speculative_decoding")
                if spec:
                    stats.update({k: spec.get(k) for k in ("total_draft_tokens", "total_accepted_draft_tokens")})
                    routed = spec.get("routed_to_target")
        except Exception as exc:  # noqa: BLE001 - counted and reported
            return Record(error=str(exc))
        finally:
            conn.close()
        return _record(times, chunks, time.perf_counter() - t0, stats, routed)

    def close(self) -> None:
        pass


def _params(config: dict[str, Any] | None) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in ((config or {}).get("parameters") or {}).items()}


def _error_message(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["message"])
    except Exception:  # noqa: BLE001
        return raw.decode("utf-8", errors="replace")[:200]
