"""The OpenAI frontend against strangers (issue 22), through `trtspec serve --openai-port` on a real tritonserver
(tiny pair, in-process orchestration): limits hold before any work is done, the API key guards /v1 while probes stay
open, only JSON POSTs are served, every response carries its X-Request-Id, /metrics and /version answer, Triton's
control APIs need the per-server key, the stubs' shared memory is owner-only, a fuzzed stream of bodies and
headers gets only 2xx or 4xx answers in OpenAI's shape (hypothesis), after which the server still answers right, and
so do fuzzed tensors sent to each Triton model over gRPC and HTTP (answered, or refused in one line).

Each test here failed on the code before issue 22 (a 500 for deep JSON, a tokenizer's message for a surrogate, a
50 MB body tokenized on the event loop, no key, text/plain served, no request id, no /metrics, Triton's shared-memory
API open, -rw-r--r-- regions)."""

from __future__ import annotations

import json
import re
import socket
import stat
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.openai_helpers import Reference, Served, with_chat_template
from tests.serving_helpers import torch_spec_dict

pytestmark = pytest.mark.triton

NAME = "guard"
KEY = "sk-test-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_INPUT_LEN = 256


@pytest.fixture(scope="module")
def target(tiny_pair, tmp_path_factory) -> Path:
    return with_chat_template(tiny_pair[0], tmp_path_factory.mktemp("guard-models") / "target")


@pytest.fixture(scope="module")
def repo(target, tiny_pair, tmp_path_factory) -> Path:
    from trtspec.pipeline import write_repo
    from trtspec.spec import spec_from_dict

    root = tmp_path_factory.mktemp("guard")
    data = torch_spec_dict(target, tiny_pair[1], name=NAME, engine={"max_seq_len": 2048, "max_input_len": 256})
    spec = spec_from_dict(data, base_dir=root, environ={})
    write_repo(spec)
    return spec.repo_dir


@pytest.fixture(scope="module")
def reference(target) -> Reference:
    return Reference(target)


@pytest.fixture(scope="module")
def served(repo, tmp_path_factory):
    server = Served(repo, tmp_path_factory.mktemp("guard-log") / "server.log", args=("--api-key", KEY))
    yield server
    assert server.stop() == 0, server.output()


def _root(served) -> str:
    return served.base_url[: -len("/v1")]


def _post(served, path: str, body, headers=None, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        served.base_url + path,
        content=content,
        headers={"Content-Type": "application/json", **AUTH, **(headers or {})},
        timeout=60,
        **kw,
    )


def _openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


def _chat(text: str, **kw) -> dict:
    return {"model": NAME, "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0, **kw}


# -- the API key ---------------------------------------------------------------------------------------------------
def test_v1_needs_the_api_key_as_a_bearer_and_probes_stay_open(served, reference):
    from trtspec import __version__

    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.get(served.base_url + "/models", headers=headers)
        assert _openai_error(r, 401)["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
        r = httpx.post(served.base_url + "/chat/completions", json=_chat("hi"), headers=headers)
        assert _openai_error(r, 401)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served.base_url, api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=served.base_url, api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [NAME]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model=NAME, messages=messages, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == reference.chat(messages, 12)[0]
    # Kubernetes probes and Prometheus scrapers send no key.
    assert httpx.get(_root(served) + "/health").json()["status"] == "ready"
    assert httpx.get(_root(served) + "/version").json() == {"version": __version__}
    assert httpx.get(_root(served) + "/metrics").status_code == 200


# -- what a web page could send ------------------------------------------------------------------------------------
def test_only_json_posts_are_served_and_no_cors_headers_are_sent(served):
    body = json.dumps(_chat("hi")).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {**AUTH, **({"Content-Type": kind} if kind else {})}
        r = httpx.post(served.base_url + "/chat/completions", content=body, headers=headers)
        assert _openai_error(r, 415)["code"] == "unsupported_media_type", kind
    r = _post(served, "/completions", {"model": NAME, "prompt": "hi", "max_tokens": 2}, {"Origin": "http://evil.test"})
    assert r.status_code == 200, r.text
    preflight = httpx.options(
        served.base_url + "/chat/completions",
        headers={"Origin": "http://evil.test", "Access-Control-Request-Method": "POST"},
    )
    for response in (r, preflight):
        assert not [h for h in response.headers if h.lower().startswith("access-control-")], response.headers


def test_every_response_carries_the_request_id_it_was_sent_or_a_new_one(served):
    r = _post(served, "/chat/completions", _chat("hi"), {"X-Request-Id": "trace-42.a:b"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42.a:b"
    ids = {httpx.get(_root(served) + "/health").headers["x-request-id"] for _ in range(2)}
    assert len(ids) == 2 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    bad = httpx.get(_root(served) + "/health", headers={"X-Request-Id": "x" * 500}).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", bad)  # not echoed: too long to be an id
    r = httpx.get(served.base_url + "/models", headers={"X-Request-Id": "denied-1"})
    assert r.status_code == 401 and r.headers["x-request-id"] == "denied-1"


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_requests_by_endpoint_and_status_with_their_latency(served):
    def scrape() -> str:
        r = httpx.get(_root(served) + "/metrics")
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        return r.text

    before = scrape()
    answered = _post(served, "/chat/completions", _chat("hi"))
    assert answered.status_code == 200
    assert httpx.post(served.base_url + "/chat/completions", json=_chat("hi")).status_code == 401
    after = scrape()
    spec = answered.json()["speculative_decoding"]  # speculation on production traffic: counted from each response
    for name, key in (("draft", "total_draft_tokens"), ("accepted_draft", "total_accepted_draft_tokens")):
        metric = f"trtspec_openai_{name}_tokens_total"
        assert _metric(after, metric) == _metric(before, metric) + spec[key]
    chat = {"endpoint": "/v1/chat/completions"}
    for status in ("200", "401"):
        assert _metric(after, "trtspec_openai_requests_total", **chat, status=status) == (
            _metric(before, "trtspec_openai_requests_total", **chat, status=status) + 1
        )
    count = _metric(after, "trtspec_openai_request_duration_seconds_count", **chat)
    assert count == _metric(before, "trtspec_openai_request_duration_seconds_count", **chat) + 2
    assert _metric(after, "trtspec_openai_request_duration_seconds_sum", **chat) > 0
    assert (
        _metric(after, "trtspec_openai_completion_tokens_total")
        >= _metric(before, "trtspec_openai_completion_tokens_total") + 1
    )
    assert "# TYPE trtspec_openai_request_duration_seconds histogram" in after
    assert _metric(after, "trtspec_openai_draining") == 0


# -- limits before work ---------------------------------------------------------------------------------------------
def _raw(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock


def _head(port: int, extra: str) -> str:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\n{extra}\r\n"
    )


def _response(sock: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split()[1]), json.loads(rest[:length])


def test_a_body_over_the_limit_is_refused_413_before_it_is_read_and_health_answers_meanwhile(served):
    from trtspec.serving.openai.limits import DEFAULT_MAX_BODY_BYTES

    port = served.ports["openai"]
    # Declared 50 MB: refused on its Content-Length, with the body not sent.
    with _raw(port) as sock:
        sock.sendall(_head(port, "Content-Length: 50000000\r\n").encode() + b'{"model": "')
        status, body = _response(sock)
    assert status == 413 and body["error"]["code"] == "request_too_large" and "50000000" in body["error"]["message"]
    # Sent without a length: /health answers while the body is on its way, the 413 comes once it passes the limit.
    with _raw(port) as sock:
        sock.sendall(_head(port, "Transfer-Encoding: chunked\r\n").encode())
        piece = b"x" * 65536
        chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
        sock.sendall(b"1\r\n[\r\n" + chunk)
        assert httpx.get(_root(served) + "/health", timeout=10).status_code == 200  # the upload is still open
        try:
            for _ in range(DEFAULT_MAX_BODY_BYTES // len(piece) + 2):
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed: what it said is read below
        status, body = _response(sock)
    assert status == 413 and body["error"]["type"] == "invalid_request_error"
    assert served.health() == 200


def test_a_prompt_too_long_in_characters_is_refused_before_tokenizing(served, target):
    from trtspec.serving.openai.limits import prompt_char_limit
    from trtspec.triton_repo.text import load_tokenizer

    limit = prompt_char_limit(load_tokenizer(target), MAX_INPUT_LEN)
    # 3 MB of text (under the 4 MiB body limit): refused on its length in characters, not after tokenizing it.
    r = _post(served, "/chat/completions", _chat("a" * 3_000_000))
    error = _openai_error(r, 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert f"at most {limit} characters" in error["message"] and "3000000 characters" in error["message"]
    r = _post(served, "/completions", {"model": NAME, "prompt": "b" * (limit + 1), "max_tokens": 2})
    assert "characters" in _openai_error(r, 400)["message"]
    # Within the character bound but over the token limit: the token count decides, as before.
    r = _post(served, "/completions", {"model": NAME, "prompt": "hello " * 300, "max_tokens": 2})
    error = _openai_error(r, 400)
    assert (
        error["code"] == "context_length_exceeded" and f"more than max_input_len ({MAX_INPUT_LEN})" in error["message"]
    )
    assert served.health() == 200


def test_deep_json_surrogates_and_unreadable_numbers_get_400s_in_openai_shape(served, reference):
    deep = b'{"model": "guard", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    for body in (deep, b'{"x": ' + b"[" * 40 + b"]" * 40 + b"}"):
        error = _openai_error(_post(served, "/chat/completions", body), 400)
        assert error["code"] == "invalid_json" and "nests deeper than 32 levels" in error["message"]
    surrogate = b'{"model": "guard", "max_tokens": 4, "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    error = _openai_error(_post(served, "/chat/completions", surrogate), 400)
    assert error["code"] == "invalid_unicode" and error["param"] == "messages.0.content"
    assert "lone surrogate (U+D800 at character 1)" in error["message"]
    stop = b'{"model": "guard", "max_tokens": 4, "prompt": "hi", "stop": ["\\udfff"]}'
    assert _openai_error(_post(served, "/completions", stop), 400)["param"] == "stop.0"
    huge = b'{"model": "guard", "max_tokens": ' + b"9" * 5000 + b', "prompt": "hi"}'
    assert "4300 digits" in _openai_error(_post(served, "/completions", huge), 400)["message"]
    big_k = {"model": NAME, "prompt": "hi", "max_tokens": 4, "top_k": 2**40}
    assert _openai_error(_post(served, "/completions", big_k), 400)["param"] == "top_k"
    assert "RecursionError" not in served.output() and "Traceback" not in served.output()
    assert _post(served, "/chat/completions", _chat("a\U0001f600b")).status_code == 200  # a real pair is fine
    messages = [{"role": "user", "content": "Speculative decoding lets a small draft model"}]
    text = _post(served, "/chat/completions", {**_chat(""), "messages": messages, "max_tokens": 10}).json()
    assert text["choices"][0]["message"]["content"] == reference.chat(messages, 10)[0]


# -- Triton behind the frontend -------------------------------------------------------------------------------------
def _tritonserver_pid(served) -> int:
    for task in Path(f"/proc/{served.proc.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if "tritonserver" in Path(f"/proc/{child}/cmdline").read_text():
                return int(child)
    raise AssertionError("no tritonserver child")


def test_tritons_control_apis_need_the_per_server_key_and_its_regions_are_owner_only(served):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    http = f"http://127.0.0.1:{served.ports['http']}"
    regions = sorted(Path("/dev/shm").glob(f"trtspec_{served.proc.pid}_*"))
    assert regions  # one per model instance (the Python backend's stubs)
    for region in regions:
        assert stat.S_IMODE(region.stat().st_mode) == 0o600, region
    register = {"key": f"/{regions[0].name}", "offset": 0, "byte_size": 64}
    control = [
        ("POST", "/v2/systemsharedmemory/region/probe/register", register),
        ("GET", "/v2/systemsharedmemory/status", None),
        ("POST", "/v2/repository/models/ensemble/unload", {}),
        ("POST", "/v2/repository/index", {}),
        ("POST", "/v2/trace/setting", {"trace_file": "/tmp/trtspec-trace"}),
        ("POST", "/v2/logging", {"log_verbose_level": 1}),
    ]
    for method, path, body in control:
        r = httpx.request(method, http + path, json=body)
        assert r.status_code == 403 and "restricted" in r.text, (path, r.status_code, r.text)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
    with pytest.raises(InferenceServerException, match="restricted"):
        client.register_system_shared_memory("probe", register["key"], 64)
    with pytest.raises(InferenceServerException, match="restricted"):
        client.unload_model("ensemble")
    # What clients read stays open: health, metadata, config, statistics.
    for path in ("/v2/health/ready", "/v2/models/ensemble", "/v2/models/ensemble/config", "/v2/models/ensemble/stats"):
        assert httpx.get(http + path).status_code == 200, path
    # The key is in the server's command line (what the README says); with it the API answers (here: no region).
    cmdline = Path(f"/proc/{_tritonserver_pid(served)}/cmdline").read_text().split("\0")
    (flag,) = [a for a in cmdline if a.startswith("--http-restricted-api=")]
    header, key = flag.split(":", 1)[1].split("=", 1)
    r = httpx.get(http + "/v2/systemsharedmemory/status", headers={header: key})
    assert r.status_code == 200, r.text
    assert served.health() == 200


def test_a_direct_model_call_with_tensors_it_cannot_use_gets_one_line_in_trtspecs_words(served):
    """Before: `index 0 is out of bounds for axis 1 with size 0` (numpy's words) for an empty request_output_len."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    def call(fields: dict) -> str:
        got: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
        client.start_stream(callback=lambda result, error: got.put(error))
        inputs = []
        for name, value in fields.items():
            x = grpcclient.InferInput(name, list(value.shape), "INT32")
            x.set_data_from_numpy(value.astype(np.int32))
            inputs.append(x)
        try:
            client.async_stream_infer("tensorrt_llm", inputs)
            return str(got.get(timeout=30))
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()

    ids = {"input_ids": np.array([[1, 2, 3]]), "input_lengths": np.array([[3]])}
    message = call({**ids, "request_output_len": np.zeros((1, 0))})
    assert "(IndexError)" in message and "out of bounds" not in message and "\n" not in message, message
    assert "outside the vocabulary" in call(
        {**ids, "input_ids": np.array([[-5, 1, 2]]), "request_output_len": np.array([[2]])}
    )
    assert served.health() == 200


# -- fuzz -----------------------------------------------------------------------------------------------------------
_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), _text)
_json = st.recursive(
    _scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=12
)
_max_tokens = st.one_of(st.integers(-3, 6), st.sampled_from([0, 10**30, "8", 2.5, None]))
_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "robot"]),
        "content": st.one_of(_text, _json),
    }
)
_fields = {
    "temperature": st.one_of(st.floats(-1, 3), st.just(float("nan")), st.just(float("inf")), _text),
    "top_p": st.one_of(st.floats(-1, 2), st.just(0)),
    "top_k": st.integers(-5, 2**33),
    "seed": st.integers(-(2**65), 2**65),
    "stop": st.one_of(_text, st.lists(_text, max_size=6), st.integers()),
    "stream": st.one_of(st.booleans(), _text),
    "stream_options": st.one_of(st.none(), st.fixed_dictionaries({"include_usage": st.booleans()}), _json),
    "n": st.integers(-1, 3),
    "num_draft_tokens": st.integers(-2, 20),
    "logprobs": st.one_of(st.booleans(), st.integers(-1, 3)),
    "echo": st.booleans(),
    "best_of": st.integers(0, 3),
}


_valid_fields = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.05, 1),
    "top_k": st.integers(0, 50),
    "seed": st.integers(0, 2**64 - 1),
    "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2),
    "stream": st.booleans(),
    "num_draft_tokens": st.integers(0, 4),
}


@st.composite
def _request(draw) -> tuple[str, bytes, dict]:
    """A body (a valid request, one with a few fields drawn from anything, any JSON, any bytes) and headers."""
    endpoint = draw(st.sampled_from(["/chat/completions", "/completions"]))
    shape = draw(st.sampled_from(["valid", "valid", "perturbed", "perturbed", "perturbed", "json", "bytes"]))
    if shape == "bytes":
        body = draw(st.binary(max_size=200))
    elif shape == "json":
        body = json.dumps(draw(_json)).encode()
    else:
        data: dict = {"model": NAME, "max_tokens": draw(st.integers(1, 6))}
        if endpoint == "/chat/completions":
            role = st.sampled_from(["user", "system"])
            data["messages"] = draw(
                st.lists(st.fixed_dictionaries({"role": role, "content": _text}), min_size=1, max_size=2)
            )
        else:
            data["prompt"] = draw(st.text(min_size=1, max_size=40))
        for name in draw(st.sets(st.sampled_from(sorted(_valid_fields)), max_size=3)):
            data[name] = draw(_valid_fields[name])
        if shape == "perturbed":
            wild = {**_fields, "model": st.sampled_from(["gpt-4o", "", NAME]), "max_tokens": _max_tokens}
            wild["messages" if endpoint == "/chat/completions" else "prompt"] = st.one_of(
                st.lists(_message, max_size=3), _text, _json
            )
            for name in draw(st.sets(st.sampled_from(sorted(wild)), min_size=1, max_size=3)):
                data[name] = draw(wild[name])
            if data.get("max_tokens") is None or isinstance(data["max_tokens"], str):
                data["max_tokens"] = 4  # chat would otherwise fill the context (thousands of tokens)
        body = json.dumps(data).encode()  # lone surrogates as \udXXX escapes, floats as NaN / Infinity
    headers = {
        "Content-Type": draw(
            st.sampled_from(["application/json", "application/json", "application/json; charset=utf-8", "text/plain"])
        ),
        **draw(st.sampled_from([AUTH, AUTH, AUTH, AUTH, {}, {"Authorization": "Bearer nope"}])),
        **draw(st.sampled_from([{}, {"X-Request-Id": "fuzz"}, {"X-Request-Id": "bad id, not a token!"}])),
    }
    return endpoint, body, headers


def _check_answer(r: httpx.Response, body: bytes) -> None:
    assert r.status_code < 500 and (200 <= r.status_code < 300 or 400 <= r.status_code < 500), (
        r.status_code,
        r.text[:300],
        body[:300],
    )
    assert r.headers.get("x-request-id"), r.headers
    if r.status_code >= 400:
        _openai_error(r, r.status_code)
    elif r.headers["content-type"].startswith("text/event-stream"):
        events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", r.text[:300]
        for event in events[:-1]:
            chunk = json.loads(event)
            assert "choices" in chunk or "error" in chunk, chunk
    else:
        assert r.json()["choices"], r.text[:300]


def test_fuzzed_bodies_and_headers_get_2xx_or_openai_4xx_and_the_server_still_answers_right(served, reference):
    with httpx.Client(base_url=served.base_url, timeout=30) as client:  # each answer within 30 s, or the test fails

        @settings(
            max_examples=120,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(_request())
        def one(request: tuple[str, bytes, dict]) -> None:
            endpoint, body, headers = request
            r = client.post(endpoint, content=body, headers=headers)
            seen[r.status_code] += 1
            _check_answer(r, body)

        seen: Counter[int] = Counter()
        one()
    # The bodies reached generation as well as every refusal (the mix is fixed: derandomized).
    assert sum(n for status, n in seen.items() if status < 300) >= 5 and {400, 401, 415} <= set(seen), seen
    assert "Traceback" not in served.output(), served.output()[-3000:]
    messages = [{"role": "user", "content": "The quick brown fox"}]
    r = _post(served, "/chat/completions", {**_chat(""), "messages": messages, "max_tokens": 16})
    assert r.json()["choices"][0]["message"]["content"] == reference.chat(messages, 16)[0]
    assert served.health() == 200


# -- fuzz of Triton's own endpoints -----------------------------------------------------------------------------------
_TRITON_MODELS = ("ensemble", "tensorrt_llm", "preprocessing", "postprocessing")
_NP = {
    "BOOL": "bool",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}


def _metadata(served) -> dict[str, list[dict]]:
    """Each model's declared inputs, as Triton reports them (name, datatype, shape)."""
    http = f"http://127.0.0.1:{served.ports['http']}"
    return {m: httpx.get(f"{http}/v2/models/{m}").json()["inputs"] for m in _TRITON_MODELS}


# A request each model serves (its required inputs, declared dtypes, [1, ...] shapes): the base that perturbations
# start from, so that the fuzz reaches generation as well as every refusal.
_VALID_BASES: dict[str, dict[str, tuple[str, list[int], list]]] = {
    "ensemble": {"text_input": ("BYTES", [1, 1], [b"The quick brown fox"]), "max_tokens": ("INT32", [1, 1], [4])},
    "tensorrt_llm": {
        "input_ids": ("INT32", [1, 3], [5, 6, 7]),
        "input_lengths": ("INT32", [1, 1], [3]),
        "request_output_len": ("INT32", [1, 1], [4]),
    },
    "preprocessing": {"QUERY": ("BYTES", [1, 1], [b"hello there"]), "REQUEST_OUTPUT_LEN": ("INT32", [1, 1], [4])},
    "postprocessing": {"TOKENS_BATCH": ("INT32", [1, 1, 3], [5, 6, 7]), "SEQUENCE_LENGTH": ("INT32", [1, 1], [3])},
}


@st.composite
def _wild_tensor(draw, spec: dict) -> tuple[str, list[int], list]:
    """Any dtype (mostly the declared one), a small shape of any rank, values from the dtype's whole range."""
    import numpy as np

    dtype = spec["datatype"] if draw(st.integers(0, 4)) else draw(st.sampled_from(sorted(_NP)))
    rank = draw(st.sampled_from([len(spec["shape"]), len(spec["shape"]), 0, 1, 3]))
    dims = [1] + [draw(st.integers(0, 4)) for _ in range(max(0, rank - 1))] if rank else []
    count = int(np.prod(dims)) if dims else 1
    if dtype == "BYTES":
        item = st.binary(max_size=30) | st.text(max_size=30).map(str.encode)
    elif dtype == "BOOL":
        item = st.booleans()
    elif dtype.startswith("FP"):
        item = st.floats(width=16 if dtype == "FP16" else 32)
    else:
        info = np.iinfo(_NP[dtype])
        item = (st.integers(-3, 8) if info.min < 0 else st.integers(0, 8)) | st.integers(int(info.min), int(info.max))
    return dtype, dims, draw(st.lists(item, min_size=count, max_size=count))


@st.composite
def _tensors(draw, metadata: dict[str, list[dict]]) -> tuple[str, str, list[tuple[str, str, list]]]:
    """A transport, a model, and its inputs: a request it serves, that request with one to three inputs replaced or
    added (declared ones, any dtype, rank and values), or inputs drawn from its declaration alone; now and then an
    input with a stranger's name."""
    model = draw(st.sampled_from(_TRITON_MODELS))
    transport = draw(st.sampled_from(["grpc", "grpc", "http_generate", "http_infer"]))
    declared = metadata[model]
    shape = draw(st.sampled_from(["valid", "perturbed", "perturbed", "wild"]))
    inputs: dict[str, tuple[str, list[int], list]] = {} if shape == "wild" else dict(_VALID_BASES[model])
    if shape == "valid" and model == "tensorrt_llm":
        inputs["request_output_len"] = ("INT32", [1, 1], [draw(st.integers(1, 6))])
    count = {"valid": 0, "perturbed": draw(st.integers(1, 3)), "wild": draw(st.integers(0, 6))}[shape]
    count = min(count, len(declared))  # postprocessing declares 4 inputs: no more unique ones to draw
    for spec in draw(st.lists(st.sampled_from(declared), min_size=count, max_size=count, unique_by=str)):
        inputs[spec["name"]] = draw(_wild_tensor(spec))
    if draw(st.integers(0, 9)) == 0:
        inputs[draw(st.text(min_size=1, max_size=12))] = draw(_wild_tensor({"datatype": "INT32", "shape": [-1]}))
    return transport, model, [(name, dtype, [dims, values]) for name, (dtype, dims, values) in inputs.items()]


def _triton_call(served, transport: str, model: str, inputs: list) -> tuple[str, str]:
    """("ok", "") when the request ended with a final response, ("error", message) when Triton or the model
    refused it; raises when no answer came within 30 s."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    arrays = [(name, dtype, np.array(values, dtype=_NP[dtype]).reshape(dims)) for name, dtype, (dims, values) in inputs]
    if transport == "http_generate":  # Triton's generate extension: JSON fields, one value each
        body = {
            name: (a.reshape(-1)[0].decode(errors="replace") if dtype == "BYTES" else a.reshape(-1)[0].item())
            for name, dtype, a in arrays
            if a.size
        }
        r = httpx.post(f"http://127.0.0.1:{served.ports['http']}/v2/models/{model}/generate", json=body, timeout=30)
        message = r.json().get("error", "") if r.status_code != 200 else ""
        # Triton's own JSON parser answers a field of the wrong JSON type with 500 before any model sees the request
        # (tritonserver 2.51's HTTP frontend; nothing trtspec serves can change it): one line, Triton's words.
        upstream_parse = r.status_code == 500 and message.startswith("Unable to parse")
        assert r.status_code < 500 or upstream_parse, (r.status_code, r.text[:300], body)
        return ("ok", "") if r.status_code == 200 else ("error", message)
    if transport == "http_infer":
        client = httpclient.InferenceServerClient(f"127.0.0.1:{served.ports['http']}", network_timeout=30)
        tensors = []
        for name, dtype, a in arrays:
            t = httpclient.InferInput(name, list(a.shape), dtype)
            t.set_data_from_numpy(a, binary_data=True)
            tensors.append(t)
        try:
            client.infer(model, tensors)
            return "ok", ""
        except InferenceServerException as exc:
            return "error", exc.message()
        finally:
            client.close()
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        tensors = []
        for name, dtype, a in arrays:
            t = grpcclient.InferInput(name, list(a.shape), dtype)
            t.set_data_from_numpy(a)
            tensors.append(t)
        client.async_stream_infer(model, tensors, enable_empty_final_response=True)
        while True:
            result, error = got.get(timeout=30)
            if error is not None:
                return "error", error.message()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "ok", ""
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def test_fuzzed_tensors_to_every_triton_model_over_grpc_and_http_get_answers_or_one_line_errors(served, reference):
    """Generated tensors (declared and stranger names, any dtype, rank and values) sent to the ensemble and to each
    model over gRPC streams, HTTP infer and HTTP generate: each is answered or refused within 30 s, a refusal is one
    line without a traceback, no stub dies, and afterwards the ensemble still gives the known greedy text."""
    metadata = _metadata(served)
    outcomes: Counter[str] = Counter()
    errors: list[str] = []

    @settings(
        max_examples=150,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(_tensors(metadata))
    def one(request: tuple[str, str, list]) -> None:
        transport, model, inputs = request
        status, message = _triton_call(served, transport, model, inputs)
        outcomes[f"{transport}:{status}"] += 1
        if status == "error":
            errors.append(message)
            assert message.strip() and "\n" not in message.strip(), (request, message)
            assert "Traceback" not in message, (request, message)

    one()
    assert sum(n for k, n in outcomes.items() if k.endswith(":ok")) >= 5, outcomes
    assert sum(n for k, n in outcomes.items() if k.endswith(":error")) >= 20, outcomes
    assert "Traceback" not in served.output(), served.output()[-3000:]
    assert "stub" not in served.output().lower() or "unhealthy" not in served.output().lower(), served.output()[-3000:]
    text = reference.complete("The quick brown fox", 12)[0]
    r = httpx.post(
        f"http://127.0.0.1:{served.ports['http']}/v2/models/ensemble/generate",
        json={"text_input": "The quick brown fox", "max_tokens": 12, "exclude_input_in_output": True},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["text_output"] == text, r.text
    assert served.health() == 200
