"""The frontend's way to Triton: tritonclient's asyncio gRPC client, one bidirectional stream per request.

A stream serves decoupled (streaming) and plain models alike. Leaving ``generate`` early (the HTTP client went away,
a stop sequence was found) cancels the gRPC call, which cancels the request in Triton.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from trtspec.errors import GenerationError
from trtspec.serving.contract import grpc_inputs, grpc_outputs, result_payload, translate
from trtspec.speculative.rules import TokenLogprob

# One response's share of a request: (new text, statistics so far, the new tokens' log-probabilities or None).
Piece = tuple[str, dict[str, float], list[TokenLogprob] | None]


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
                ok = bool(await client.is_server_ready(client_timeout=2.0)) and bool(
                    await client.is_model_ready(self.model, client_timeout=2.0)
                )
            except Exception:  # noqa: BLE001 - unreachable is not ready
                ok = False
            self._ready, self._ready_at = ok, time.monotonic()
        return self._ready

    async def generate(self, values: dict[str, Any], logprobs: int | None = None) -> AsyncGenerator[Piece, None]:
        """(text, statistics, None) per response for one request in ensemble field names. ``logprobs``: this
        contract has no log-probabilities (refused)."""
        import grpc

        if logprobs is not None:
            raise GenerationError(
                f"log-probabilities are not supported by the {self.contract} contract", hint="leave logprobs out"
            )
        inputs = grpc_inputs(translate(values, self.contract), self.contract)
        request = {
            "model_name": self.model,
            "inputs": inputs,
            "outputs": grpc_outputs(self.contract),
            "request_id": uuid.uuid4().hex,
        }

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield request  # then the client half-closes: the stream ends after the request's last response

        stream = self._grpc().stream_infer(one_request())
        try:
            async for result, error in stream:
                if error is not None:
                    raise TritonRequestError(_message(error))
                payload = result_payload(result, self.contract)
                if payload is not None:
                    yield payload[0], payload[1], None
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc) from None
        finally:
            stream.cancel()  # a no-op for a finished call; otherwise Triton cancels the request

    def _rpc_error(self, exc: Any) -> BaseException:
        """What a failed gRPC call means to the frontend: unavailable (retry later), cancelled, or a request error."""
        import grpc

        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            self._ready_at = 0.0
            return TritonUnavailable(exc.details() or str(exc.code()))
        if exc.code() == grpc.StatusCode.CANCELLED:
            return asyncio.CancelledError()
        return TritonRequestError(exc.details() or str(exc.code()))


def _message(error: Any) -> str:
    message = getattr(error, "message", None)
    return str(message() if callable(message) else error)


class DirectBackend(TritonBackend):
    """Ensemble repositories: requests go straight to the draft-target model (the ensemble's middle step),
    tokenized here exactly as the ``preprocessing`` model does and decoded as ``postprocessing`` does.

    Why not the ensemble: Triton's ensemble scheduler passes a cancelled request on only to the steps it has not
    started, so a client that disconnects would leave the running draft-target step generating to the end. A
    request to the draft-target model itself is cancelled in that model (``request.is_cancelled()``), which stops
    its generation and frees its KV slot."""

    def __init__(
        self, url: str, model: str, tokenizer_dir: Any, add_special_tokens: bool = True, ready_cache_s: float = 1.0
    ) -> None:
        from trtspec.triton_repo.text import Postprocessor, Preprocessor, load_tokenizer

        super().__init__(url, model, "ensemble", ready_cache_s)
        tok = load_tokenizer(tokenizer_dir)
        self.pre = Preprocessor(tok, add_special_tokens)
        self.post = Postprocessor(tok)

    def _inputs(self, values: dict[str, Any], logprobs: int | None = None) -> tuple[list[Any], list[int]]:
        import numpy as np
        import tritonclient.grpc as grpcclient

        from trtspec.request_fields import engine_tensors
        from trtspec.runtimes.inflight.contract import encode_word_list
        from trtspec.triton_repo.text import decode_text

        tokens = self.pre.encode(decode_text(values["text_input"]), chat=bool(values.get("apply_chat_template")))
        fields: dict[str, tuple[Any, str]] = {
            "input_ids": (np.asarray([tokens], dtype=np.int32), "INT32"),
            "input_lengths": (np.asarray([[len(tokens)]], dtype=np.int32), "INT32"),
            "request_output_len": (np.asarray([[values["max_tokens"]]], dtype=np.int32), "INT32"),
            "end_id": (np.asarray([[values.get("end_id", self.pre.end_id)]], dtype=np.int32), "INT32"),
            "pad_id": (np.asarray([[values.get("pad_id", self.pre.pad_id)]], dtype=np.int32), "INT32"),
            "streaming": (np.asarray([[bool(values.get("stream"))]], dtype=np.bool_), "BOOL"),
            "exclude_input_in_output": (np.asarray([[True]], dtype=np.bool_), "BOOL"),
        }
        if logprobs is not None:
            fields["return_log_probs"] = (np.asarray([[True]], dtype=np.bool_), "BOOL")
            fields["top_logprobs"] = (np.asarray([[logprobs]], dtype=np.int32), "INT32")
        fields.update(engine_tensors(values))  # sampling and speculation fields (trtspec.request_fields)
        for key, name in (("stop_words", "stop_words_list"), ("bad_words", "bad_words_list")):
            if values.get(key):
                fields[name] = (encode_word_list(self.pre.words(values[key], key))[None], "INT32")
        inputs = []
        for name, (arr, dtype) in fields.items():
            x = grpcclient.InferInput(name, list(arr.shape), dtype)
            x.set_data_from_numpy(arr)
            inputs.append(x)
        return inputs, tokens

    async def generate(self, values: dict[str, Any], logprobs: int | None = None) -> AsyncGenerator[Piece, None]:
        """(text, statistics, log-probabilities) per response for one request in ensemble field names.
        ``logprobs`` N: each new token's log-probability under the target and its N most likely alternatives
        (the model's return_log_probs / top_logprobs); None: none."""
        import grpc
        import tritonclient.grpc as grpcclient

        from trtspec.serving.contract import STAT_NAMES

        inputs, _tokens = await asyncio.to_thread(self._inputs, values, logprobs)  # tokenizing: off the event loop
        names = ["output_ids", "sequence_length", "decoded_length", "is_final", *STAT_NAMES]
        if logprobs is not None:
            names += ["output_log_probs", *(("output_top_ids", "output_top_log_probs") if logprobs else ())]
        outputs = [grpcclient.InferRequestedOutput(n) for n in names]
        request = {"model_name": self.model, "inputs": inputs, "outputs": outputs, "request_id": uuid.uuid4().hex}

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield request

        stream = self._grpc().stream_infer(one_request())
        try:
            async for result, error in stream:
                if error is not None:
                    raise TritonRequestError(_message(error))
                ids = result.as_numpy("output_ids")
                if ids is None:
                    continue
                n = int(result.as_numpy("sequence_length").reshape(-1)[0])
                decoded = int(result.as_numpy("decoded_length").reshape(-1)[0])
                final = bool(result.as_numpy("is_final").reshape(-1)[0])
                text = self.post.delta(ids.reshape(-1)[:n].tolist(), decoded, final)
                stats: dict[str, float] = {}
                for name in STAT_NAMES:
                    v = result.as_numpy(name)
                    if v is not None:
                        stats[name] = float(v.reshape(-1)[0]) if name == "acceptance_rate" else int(v.reshape(-1)[0])
                lps = _token_logprobs(result, ids.reshape(-1)[:n].tolist(), decoded) if logprobs is not None else None
                yield text, stats, lps
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(exc) from None
        finally:
            stream.cancel()


def _token_logprobs(result: Any, ids: list[int], decoded: int) -> list[TokenLogprob]:
    """The new tokens' (after the ``decoded`` context tokens) log-probabilities from one response's tensors."""
    lp = result.as_numpy("output_log_probs")
    if lp is None:
        return []
    values = lp.reshape(-1).tolist()
    top_ids, top_lps = result.as_numpy("output_top_ids"), result.as_numpy("output_top_log_probs")
    out = []
    for j in range(decoded, len(ids)):
        top: tuple[tuple[int, float], ...] = ()
        if top_ids is not None and top_lps is not None:
            top = tuple(zip(top_ids[0, j].tolist(), top_lps[0, j].tolist()))
        out.append(TokenLogprob(int(ids[j]), float(values[j]), top))
    return out
