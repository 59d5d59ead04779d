"""The OpenAI-compatible frontend of `trtspec serve --openai-port`, driven by the official `openai` package unchanged,
against a real tritonserver over real HTTP, for both repository kinds: the ensemble (torch runtime, tiny pair) and
the LLM-API repository (TensorRT-LLM's LLM API is the STAND-IN in tests/standin/llmapi, as in
test_llmapi_serving.py). Expected texts are transformers' own greedy generate on the target."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai
import pytest

from tests.openai_helpers import Reference, Served, with_chat_template
from tests.serving_helpers import make_noisy_draft, torch_spec_dict

pytestmark = pytest.mark.triton

NAME = "tiny-chat"
MAX_SEQ_LEN = 512
MAX_INPUT_LEN = 256
STANDIN = Path(__file__).parent / "standin" / "llmapi"
QUESTIONS = [
    "The quick brown fox",
    "What is the capital of France?",
    "def add(a, b):",
    "Zürich, naïve café 🙂",
    "Speculative decoding lets a small draft model",
    "emoji",
    "The lazy dog. The quick",
    "A",
]


def _spec(kind: str, root: Path, target: Path, draft: Path):
    if kind == "ensemble":
        from trtspec.spec import spec_from_dict

        # BLS: the target is a model of its own, so Triton's statistics count its steps (see _work).
        data = torch_spec_dict(
            target,
            draft,
            name=NAME,
            engine={"max_seq_len": MAX_SEQ_LEN, "max_input_len": MAX_INPUT_LEN},
            triton={"orchestration": "bls"},
        )
        return spec_from_dict(data, base_dir=root, environ={}), {}
    from tests.engine_helpers import engine_spec

    none = {"quantization": "none", "dtype": "float16"}
    spec = engine_spec(
        root,
        (target, draft),
        runtime="trtllm-llmapi",
        name=NAME,
        target=none,
        draft=none,
        engine={"trtllm_version": "1.1.0", "max_seq_len": MAX_SEQ_LEN, "max_input_len": MAX_INPUT_LEN},
        speculative={"max_draft_len": 3},
    )
    env = {
        "TRTSPEC_EXTRA_PYTHONPATH": str(STANDIN),
        "TRTLLM_STANDIN_VERSION": "1.1.0",
        "TRTLLM_STANDIN_SPEC_METRICS": "filled",  # as a release with TensorRT-LLM PR #17082 reports them
        "TRTLLM_STANDIN_MOUNTS": f"/checkpoints/target={target};/checkpoints/draft={draft}",
    }
    return spec, env


@pytest.fixture(scope="module")
def chat_pair(tiny_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("openai-models")
    target = with_chat_template(tiny_pair[0], root / "target")
    return target, make_noisy_draft(target, root / "draft")  # the draft agrees with the target part of the time


@pytest.fixture(scope="module")
def reference(chat_pair):
    return Reference(chat_pair[0])


@pytest.fixture(scope="module", params=["ensemble", "llmapi"])
def served(request, chat_pair, tmp_path_factory):
    from trtspec.pipeline import write_repo

    root = tmp_path_factory.mktemp(f"openai-{request.param}")
    spec, env = _spec(request.param, root, *chat_pair)
    write_repo(spec)
    step_log = root / "standin-steps.log"
    server = Served(spec.repo_dir, root / "server.log", env={**env, "TRTLLM_STANDIN_STEP_LOG": str(step_log)})
    server.kind, server.step_log = request.param, step_log
    yield server
    assert server.stop() == 0, server.output()


def _client(served, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, **kw)


def _chat(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def test_models_lists_the_served_model_and_health_is_ready(served):
    models = _client(served).models.list()
    assert [m.id for m in models.data] == [NAME]
    info = models.data[0].model_extra["trtspec"]
    assert info["runtime"] == ("torch" if served.kind == "ensemble" else "trtllm-llmapi")
    assert info["max_seq_len"] == MAX_SEQ_LEN and info["max_draft_len"] > 0
    assert served.health() == 200
    r = httpx.get(served.base_url + "/models/" + NAME)
    assert r.status_code == 200 and r.json()["id"] == NAME


def test_chat_streamed_chunks_concatenate_to_the_greedy_text_with_usage(served, reference):
    client = _client(served)
    messages = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": QUESTIONS[1]}]
    text, n_prompt, n_out = reference.chat(messages, 24)
    plain = client.chat.completions.create(model=NAME, messages=messages, max_tokens=24, temperature=0)
    assert plain.choices[0].message.content == text
    assert plain.choices[0].message.role == "assistant"
    assert plain.choices[0].finish_reason == ("length" if n_out == 24 else "stop")
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (n_prompt, n_out)
    assert plain.usage.total_tokens == n_prompt + n_out
    spec = plain.model_extra["speculative_decoding"]
    assert spec["total_draft_tokens"] > 0 and 0 <= spec["total_accepted_draft_tokens"] <= spec["total_draft_tokens"]

    chunks = list(
        client.chat.completions.create(
            model=NAME,
            messages=messages,
            max_completion_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == text and len([d for d in deltas if d]) > 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == n_out
    assert chunks[-1].usage.prompt_tokens == n_prompt
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_completion_streamed_and_not(served, reference):
    client = _client(served)
    text, n_prompt, n_out = reference.complete(QUESTIONS[0], 16)
    plain = client.completions.create(model=NAME, prompt=QUESTIONS[0], max_tokens=16, temperature=0)
    assert plain.choices[0].text == text and plain.object == "text_completion"
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (n_prompt, n_out)
    streamed = list(
        client.completions.create(model=NAME, prompt=QUESTIONS[0], max_tokens=16, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in streamed) == text
    echoed = client.completions.create(model=NAME, prompt=QUESTIONS[0], max_tokens=16, temperature=0, echo=True)
    assert echoed.choices[0].text == QUESTIONS[0] + text


def test_stop_sequence_cuts_the_text_before_it(served, reference):
    client = _client(served)
    text, _, _ = reference.chat(_chat(QUESTIONS[4]), 32)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), text
    expected = text[: text.find(stop)]
    plain = client.chat.completions.create(
        model=NAME, messages=_chat(QUESTIONS[4]), max_tokens=32, temperature=0, stop=[stop]
    )
    assert plain.choices[0].message.content == expected and plain.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model=NAME, messages=_chat(QUESTIONS[4]), max_tokens=32, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected


def test_eight_concurrent_streamed_chats_each_get_their_own_text(served, reference):
    lengths = [9, 12, 16, 20, 24, 28, 32, 36]
    expected = [reference.chat(_chat(q), n)[0] for q, n in zip(QUESTIONS, lengths)]

    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        stream = await client.chat.completions.create(
            model=NAME, messages=_chat(QUESTIONS[i]), max_tokens=lengths[i], temperature=0, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def main() -> list[str]:
        async with openai.AsyncOpenAI(base_url=served.base_url, api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*[one(client, i) for i in range(8)])

    assert asyncio.run(main()) == expected


def _error(exc_info) -> dict:
    body = exc_info.value.body
    assert isinstance(body, dict) and {"message", "type", "param", "code"} <= set(body), body
    return body


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(served, reference):
    client = _client(served)
    good = dict(model=NAME, messages=_chat(QUESTIONS[0]), max_tokens=8, temperature=0)
    cases = [
        ({"max_tokens": -3}, openai.BadRequestError, "max_tokens"),
        ({"max_tokens": 0}, openai.BadRequestError, "max_tokens"),
        ({"n": 0}, openai.BadRequestError, "n"),
        ({"presence_penalty": 2.5}, openai.BadRequestError, "presence_penalty"),
        ({"temperature": -1}, openai.BadRequestError, "temperature"),
        ({"top_p": 1.5}, openai.BadRequestError, "top_p"),
        ({"model": "gpt-4o"}, openai.NotFoundError, "model"),
        ({"messages": _chat("hello " * 300)}, openai.BadRequestError, "messages"),
        ({"max_tokens": MAX_SEQ_LEN}, openai.BadRequestError, "max_tokens"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, openai.BadRequestError, "messages.0.role"),
        ({"stream": True, "max_tokens": -1}, openai.BadRequestError, "max_tokens"),
    ]
    for override, error, param in cases:
        with pytest.raises(error) as exc_info:
            client.chat.completions.create(**{**good, **override})
        body = _error(exc_info)
        assert body["param"] == param, (override, body)
        assert exc_info.value.status_code == (404 if error is openai.NotFoundError else 400)
    with pytest.raises(openai.BadRequestError) as exc_info:
        client.completions.create(model=NAME, prompt="hello " * 300, max_tokens=4)
    assert _error(exc_info)["code"] == "context_length_exceeded"
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        r = httpx.post(served.base_url + "/chat/completions", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    r = httpx.get(served.base_url + "/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert served.health() == 200
    text = client.chat.completions.create(**good).choices[0].message.content
    assert text == reference.chat(_chat(QUESTIONS[0]), 8)[0]


def test_num_draft_tokens_extension(served, reference):
    client = _client(served)
    kw = dict(model=NAME, messages=_chat(QUESTIONS[2]), max_tokens=20, temperature=0)
    if served.kind == "llmapi":  # the LLM API applies the deployment's speculative_config to every request
        with pytest.raises(openai.BadRequestError) as exc_info:
            client.chat.completions.create(**kw, extra_body={"num_draft_tokens": 2})
        assert _error(exc_info)["param"] == "num_draft_tokens"
        return
    target_only = client.chat.completions.create(**kw, extra_body={"num_draft_tokens": 0})
    k2 = client.chat.completions.create(**kw, extra_body={"num_draft_tokens": 2})
    text = reference.chat(_chat(QUESTIONS[2]), 20)[0]
    assert target_only.choices[0].message.content == k2.choices[0].message.content == text
    assert target_only.model_extra["speculative_decoding"]["total_draft_tokens"] == 0
    assert target_only.model_extra["speculative_decoding"]["routed_to_target"] is True
    assert k2.model_extra["speculative_decoding"]["num_draft_tokens"] == 2
    assert k2.model_extra["speculative_decoding"]["total_draft_tokens"] > 0


def _work(served) -> int:
    """Work the target has done so far: executions of the ensemble's target model (Triton's statistics), or the
    decoding steps of the stand-in LLM API (its step log)."""
    if served.kind == "llmapi":
        return len(served.step_log.read_text().splitlines()) if served.step_log.exists() else 0
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        stats = client.get_inference_statistics("tensorrt_llm", as_json=True)["model_stats"][0]
        return int(stats["inference_stats"].get("success", {}).get("count", 0))
    finally:
        client.close()


def _settled(served, deadline_s: float = 60.0) -> int:
    """The work count once it stopped changing (two equal readings a second apart)."""
    import time

    last, end = _work(served), time.monotonic() + deadline_s
    while time.monotonic() < end:
        time.sleep(1.0)
        now = _work(served)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the server kept working for {deadline_s:.0f} s")


def test_client_that_disconnects_mid_stream_frees_its_request(served, reference):
    n = MAX_SEQ_LEN - 64
    body = {"model": NAME, "messages": _chat(QUESTIONS[5]), "max_tokens": n, "temperature": 0, "stream": True}
    before = _settled(served)
    with httpx.stream("POST", served.base_url + "/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert any('"content":"' in next(lines) for _ in range(8))  # text is flowing: the request is running
    after = _settled(served) - before
    # (Triton's request metrics cannot tell: a decoupled model's request counts as a success when execute returns.)
    # A finished request would have taken at least n / (K + 1) target steps (every draft token accepted): fewer
    # means it was cut short. How many fewer depends on the step's speed, not on the cancellation: the watcher asks
    # every 100 ms, and at a few milliseconds a step the request runs some tens of steps before its abort (31 once
    # each pass ran in one OpenMP region, 2026-12-07, where a quarter of n / (K + 1) had been the bound).
    assert after < n / (1 + 4), f"{after} target steps after the client left"
    # The next request is served alone and right.
    text = (
        _client(served)
        .chat.completions.create(model=NAME, messages=_chat(QUESTIONS[6]), max_tokens=12, temperature=0)
        .choices[0]
        .message.content
    )
    assert text == reference.chat(_chat(QUESTIONS[6]), 12)[0]


def _bench(*args, timeout=600):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "trtspec", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def test_bench_over_the_openai_api_sweeps_k_beside_target_only_in_open_loop(served, tmp_path):
    import json

    plot = tmp_path / "bench.png"
    args = [
        "--openai",
        served.base_url,
        "--request-rate",
        "4",
        "--requests",
        "4",
        "-n",
        "12",
        "--json",
        "--plot",
        str(plot),
    ]
    if served.kind == "llmapi":  # no per-request K there
        r = _bench(*args, "--num-draft-tokens", "1,2")
        assert r.returncode == 1 and "applies its own K" in r.stderr and "Traceback" not in r.stderr
        r = _bench(*args)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert [m["mode"] for m in out["levels"][0]["modes"]] == ["speculative"]
        assert any("no target-only baseline" in w for w in out["warnings"])
        return
    r = _bench(*args, "--num-draft-tokens", "1,2")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    setup = out["setup"]
    assert (setup["protocol"], setup["model"], setup["runtime"], setup["load"]) == (
        "openai",
        NAME,
        "torch",
        "request_rate",
    )
    assert [m["num_draft_tokens"] for m in setup["modes"]] == [0, 1, 2] and setup["workload"]["max_tokens"]["max"] == 12
    assert setup["prompt_set"].startswith("built-in")
    (level,) = out["levels"]
    assert level["request_rate"] == 4.0
    modes = {m["mode"]: m for m in level["modes"]}
    assert set(modes) == {"target_only", "K=1", "K=2"}
    for name, m in modes.items():
        assert m["requests"] == 4 and m["errors"] == 0 and m["output_tok_per_s"] > 0
        assert m["ttft_p50_s"] <= m["ttft_p90_s"] <= m["ttft_p99_s"] and m["itl_p99_s"] and m["e2e_p50_s"]
        assert m["routed_to_target"] == (4 if name == "target_only" else 0)
        assert ("speedup" in m) == (name != "target_only")
    assert modes["target_only"]["acceptance_rate"] is None and 0 < modes["K=1"]["acceptance_rate"] <= 1
    assert out["warnings"] == [] and plot.stat().st_size > 10_000


def test_bench_warns_when_requests_fall_below_the_route_threshold(served):
    if served.kind == "llmapi":
        pytest.skip("the LLM-API deployment does not route")
    r = _bench("--url", served.grpc_url, "-c", "2", "--requests", "2", "-n", "4")  # route_threshold is 8
    assert r.returncode == 0, r.stderr
    assert "fewer than the route threshold (8)" in " ".join(r.stderr.split())
    out = " ".join(r.stdout.split())
    assert "trtspec bench: ensemble (torch) via grpc" in out and "target-only, K=4" in out


def test_logprobs_are_refused_by_name_where_the_deployment_cannot_serve_them(served):
    """The BLS orchestration's model refuses return_log_probs (a 400 with its words); the LLM-API runtime's door
    refuses logprobs before anything is sent. tests/test_openai_logprobs.py serves them (in-process model)."""
    client = _client(served)
    with pytest.raises(openai.BadRequestError) as exc_info:
        client.chat.completions.create(
            model=NAME, messages=_chat(QUESTIONS[0]), max_tokens=8, temperature=0, logprobs=True
        )
    message = _error(exc_info)["message"]
    if served.kind == "ensemble":
        assert "return_log_probs is not supported by the BLS orchestration" in message
    else:
        assert _error(exc_info)["param"] == "logprobs" and "trtllm-llmapi" in message
    assert client.completions.create(model=NAME, prompt=QUESTIONS[0], max_tokens=4, temperature=0).choices[0].text


def test_n_choices_each_one_sequence_streamed_and_not(served, reference):
    """n > 1 (issue 21): n sequences of their own, run concurrently: greedy choices are the greedy text; sampled
    choice i with seed s is what one request with seed s + i gets (reproducible and different); streamed chunks carry
    each choice's index and concatenate per index to the unstreamed texts; usage counts the prompt once."""
    client = _client(served)
    messages = _chat(QUESTIONS[0])
    text, n_prompt, n_out = reference.chat(messages, 12)
    greedy = client.chat.completions.create(model=NAME, messages=messages, max_tokens=12, temperature=0, n=2)
    assert [c.index for c in greedy.choices] == [0, 1]
    assert [c.message.content for c in greedy.choices] == [text, text]
    assert (greedy.usage.prompt_tokens, greedy.usage.completion_tokens) == (n_prompt, 2 * n_out)

    kw = dict(model=NAME, prompt=QUESTIONS[1], max_tokens=12, temperature=1.0)
    sampled = client.completions.create(**kw, n=3, seed=40)
    alone = [client.completions.create(**kw, seed=40 + i).choices[0].text for i in range(3)]
    assert [c.text for c in sampled.choices] == alone
    assert len(set(alone)) > 1  # the choices differ: not one sequence copied
    chunks = list(client.completions.create(**kw, n=3, seed=40, stream=True))
    per_index = ["", "", ""]
    for c in chunks:
        for choice in c.choices:
            per_index[choice.index] += choice.text
    assert per_index == alone
    reasons = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert len(reasons) == 3

    with pytest.raises(openai.BadRequestError) as exc_info:
        client.completions.create(**kw, n=17)
    assert _error(exc_info)["param"] == "n" and "n must be in 1..16, got 17" in _error(exc_info)["message"]
