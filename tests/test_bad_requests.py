"""Every malformed request gets an error response, on every protocol (real tritonserver, the tiny pair): gRPC stream
(with and without empty final responses), gRPC unary, HTTP generate and generate_stream.

Triton 2.51 checks only the number of inputs: a request without text_input but with two other inputs is admitted,
the ensemble never runs the step that needs text_input, and the client gets an empty final response (or nothing,
without enable_empty_final_response), HTTP generate_stream an empty 200 (measured before this fix)."""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request

import numpy as np
import pytest

from tests.serving_helpers import torch_spec_dict
from trtspec.spec import spec_from_dict

pytestmark = pytest.mark.triton

CASES = {
    "no text_input, streamed": ({"max_tokens": 8, "stream": True}, "missing required input(s) text_input"),
    "no text_input, not streamed": ({"max_tokens": 8, "stream": False}, "missing required input(s) text_input"),
    "no max_tokens, streamed": ({"text_input": "hello", "stream": True}, "missing required input(s) max_tokens"),
    # Preprocessing takes neither input it was sent: Triton answers for it (the Python backend gets no inputs at all).
    "only stream": ({"stream": True}, "request has 0 inputs"),
    "max_tokens 0, streamed": (
        {"text_input": "hello", "max_tokens": 0, "stream": True},
        "max_tokens must be >= 1, got 0",
    ),
}
TYPES = {"text_input": ("BYTES", object), "max_tokens": ("INT32", np.int32), "stream": ("BOOL", bool)}


@pytest.fixture(scope="module", params=[True, False], ids=["decoupled", "not-decoupled"])
def served(request, tiny_pair, tmp_path_factory):
    from trtspec.pipeline import write_repo
    from trtspec.serving.server import TritonServer

    root = tmp_path_factory.mktemp("bad")
    spec = spec_from_dict(torch_spec_dict(*tiny_pair, triton={"decoupled": request.param}), base_dir=root, environ={})
    write_repo(spec)
    with TritonServer(spec.repo_dir, log_file=root / "server.log") as server:
        server.decoupled = request.param  # type: ignore[attr-defined]
        yield server


def _inputs(fields: dict) -> list:
    import tritonclient.grpc as grpcclient

    out = []
    for name, value in fields.items():
        dtype, np_type = TYPES[name]
        arr = np.array([[value.encode() if isinstance(value, str) else value]], dtype=np_type)
        x = grpcclient.InferInput(name, list(arr.shape), dtype)
        x.set_data_from_numpy(arr)
        out.append(x)
    return out


def _grpc_stream(url: str, fields: dict, empty_final: bool) -> str:
    """The first error the stream gets; fails on a response without one, or on silence."""
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer("ensemble", _inputs(fields), enable_empty_final_response=empty_final)
        try:
            result, error = got.get(timeout=30)
        except queue.Empty:
            pytest.fail("no response at all within 30 s")
        assert error is not None, f"a response without an error: {result.get_response()}"
        return str(error)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def _http(url: str, endpoint: str, fields: dict) -> str:
    req = urllib.request.Request(
        f"http://{url}/v2/models/ensemble/{endpoint}",
        data=json.dumps(fields).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read().decode()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode()
    body = body.strip().removeprefix("data:").strip()
    assert body, f"{endpoint}: an empty answer"
    return str(json.loads(body.splitlines()[0].removeprefix("data:").strip()).get("error", body))


@pytest.mark.parametrize("case", CASES)
def test_a_bad_request_gets_an_error_on_every_protocol(served, case):
    import tritonclient.grpc as grpcclient

    fields, message = CASES[case]
    if not served.decoupled and fields.get("stream"):
        fields = {**fields, "stream": False}  # a plain repository refuses streaming itself (test_server.py)
    for empty_final in (False, True):
        assert message in _grpc_stream(served.grpc_url, fields, empty_final), (case, empty_final)
    client = grpcclient.InferenceServerClient(served.grpc_url)
    with pytest.raises(Exception) as unary:
        client.infer("ensemble", _inputs(fields), client_timeout=30)
    client.close()
    # A decoupled model answers only the stream: Triton refuses the unary RPC itself.
    assert (message if not served.decoupled else "decoupled") in str(unary.value)
    if served.decoupled and fields.get("stream"):
        assert message in _http(served.http_url, "generate_stream", fields)
    else:
        for endpoint in ("generate", "generate_stream"):
            assert message in _http(served.http_url, endpoint, fields), endpoint
