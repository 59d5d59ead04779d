"""A real Triton server (nvidia-pytriton's tritonserver) serving the tiny pair through the ensemble: lossless greedy
text over gRPC and HTTP, streaming, concurrency, batch > 1, routing statistics, bad requests. One server for the
module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.serving_helpers import make_noisy_draft, torch_spec_dict
from trtspec.errors import GenerationError
from trtspec.serving.client import TritonLLMClient
from trtspec.spec import spec_from_dict

pytestmark = pytest.mark.triton

PROMPTS = [
    "The quick brown fox",
    "Zürich, naïve café, 東京 🙂",
    "def add(a, b):\n    return a",
    "Q: What is the capital of France? A:",
    "Speculative decoding lets a small draft model",
    "emoji",
    "The lazy dog. The quick",
    "A",
]
MAX_SEQ_LEN = 512
ROUTE = 8


@pytest.fixture(scope="module", params=["in_process", "bls"])
def served(request, tiny_pair, tmp_path_factory):
    """The torch runtime served both ways: the in-process draft-target model, and the BLS orchestrator over two
    engine models (the path runtime trtllm-engine takes, with the torch models speaking the engines' contract)."""
    from trtspec.pipeline import write_repo
    from trtspec.serving.server import TritonServer

    root = tmp_path_factory.mktemp("serving")
    draft = make_noisy_draft(tiny_pair[0], root / "draft")
    spec = spec_from_dict(
        torch_spec_dict(
            tiny_pair[0],
            draft,
            # The fixed model drafter drafts every step: these tests check the draft-target loop's serving contract.
            # (The adaptive default may rightly choose not to draft here; test_serving_drafters serves it.)
            speculative={"route_threshold": ROUTE, "drafter": "model"},
            engine={"max_seq_len": MAX_SEQ_LEN},
            triton={"orchestration": request.param},
        ),
        base_dir=root,
        environ={},
    )
    write_repo(spec)
    with TritonServer(spec.repo_dir, log_file=root / "server.log") as server:
        yield server


@pytest.fixture(scope="module")
def reference(tiny_pair):
    """In-process target-only greedy text (the coordinator's torch runtime, no Triton)."""
    from trtspec.runtimes.torch.session import TorchSession

    session = TorchSession(tiny_pair[0], None)
    cache: dict[tuple[str, int], str] = {}

    def text(prompt: str, n: int) -> str:
        if (prompt, n) not in cache:
            cache[(prompt, n)] = session.generate(prompt, n, use_draft=False, chat=False).text
        return cache[(prompt, n)]

    return text


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_greedy_text_equals_in_process_target_only(served, reference, protocol):
    url = served.grpc_url if protocol == "grpc" else served.http_url
    with TritonLLMClient(url, protocol=protocol) as client:
        for prompt in PROMPTS[:3]:
            r = client.generate(prompt, 24)
            assert r.text == reference(prompt, 24)
            assert r.stats["total_draft_tokens"] > 0  # through the draft-target loop, not routed


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_streamed_responses_concatenate_to_the_non_streamed_text(served, reference, protocol):
    url = served.grpc_url if protocol == "grpc" else served.http_url
    with TritonLLMClient(url, protocol=protocol) as client:
        for prompt in (PROMPTS[1], PROMPTS[0]):
            whole = client.generate(prompt, 40).text
            streamed = client.generate(prompt, 40, stream=True)
            assert len(streamed.chunks) > 2
            assert "".join(streamed.chunks) == whole == reference(prompt, 40)


def test_streamed_text_is_exact_for_characters_split_across_responses(served, tiny_tokenizer):
    """Postprocessing as the ensemble drives it while streaming: one token per response, multi-byte characters
    split over several tokens."""
    import tritonclient.grpc as grpcclient

    from trtspec.triton_repo.text import load_tokenizer

    tok = load_tokenizer(tiny_tokenizer)
    text = "Zürich, naïve café, 東京 🙂!"
    ids = tok.encode(text, add_special_tokens=False)
    assert any(tok.decode([i]).endswith("\ufffd") for i in ids)
    client = grpcclient.InferenceServerClient(served.grpc_url)
    out = []
    for end in range(1, len(ids) + 1):
        start = max(0, end - 1 - 32)
        window = np.array([[ids[start:end]]], dtype=np.int32)
        inputs = []
        for name, arr, dtype in (
            ("TOKENS_BATCH", window, "INT32"),
            ("SEQUENCE_LENGTH", np.array([[end - start]], dtype=np.int32), "INT32"),
            ("DECODED_LENGTH", np.array([[end - 1 - start]], dtype=np.int32), "INT32"),
            ("IS_FINAL", np.array([[end == len(ids)]]), "BOOL"),
        ):
            x = grpcclient.InferInput(name, list(arr.shape), dtype)
            x.set_data_from_numpy(arr)
            inputs.append(x)
        out.append(client.infer("postprocessing", inputs).as_numpy("OUTPUT")[0, 0].decode("utf-8"))
    client.close()
    assert "".join(out) == text and not any("\ufffd" in o for o in out)


def test_eight_concurrent_requests_each_get_their_own_text(served, reference):
    lengths = [9, 12, 16, 20, 24, 28, 32, 36]
    expected = {i: reference(PROMPTS[i], n) for i, n in enumerate(lengths)}
    results: dict[int, str] = {}
    errors: list[Exception] = []
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            with TritonLLMClient(served.grpc_url) as client:
                start.wait()
                results[i] = client.generate(PROMPTS[i], lengths[i], stream=i % 2 == 1).text
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert results == expected


def test_batch_of_two_prompts_in_one_request(served, reference):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(served.grpc_url)
    prompts = [PROMPTS[0], PROMPTS[3]]
    inputs = []
    for name, arr, dtype in (
        ("text_input", np.array([[p.encode()] for p in prompts], dtype=np.object_), "BYTES"),
        ("max_tokens", np.array([[20], [20]], dtype=np.int32), "INT32"),
        ("exclude_input_in_output", np.array([[True], [True]]), "BOOL"),
    ):
        x = grpcclient.InferInput(name, list(arr.shape), dtype)
        x.set_data_from_numpy(arr)
        inputs.append(x)
    responses = []
    client.start_stream(callback=lambda result, error: responses.append((result, error)))
    client.async_stream_infer("ensemble", inputs)
    client.stop_stream()  # waits for the outstanding response
    client.close()
    ((result, error),) = responses
    assert error is None
    texts = [t.decode("utf-8") for t in result.as_numpy("text_output").reshape(-1)]
    assert texts == [reference(p, 20) for p in prompts]
    assert result.as_numpy("total_draft_tokens").reshape(-1).tolist()[0] > 0


def test_routing_below_threshold_skips_the_draft_and_above_reports_acceptance(served):
    with TritonLLMClient(served.grpc_url) as client:
        short = client.generate(PROMPTS[2], ROUTE - 1)
        assert short.stats["total_draft_tokens"] == 0 and short.stats["acceptance_rate"] == 0.0
        assert short.stats["num_output_tokens"] == ROUTE - 1
        long = client.generate(PROMPTS[2], 32)
        s = long.stats
        assert s["total_draft_tokens"] > 0 and 0 < s["total_accepted_draft_tokens"] <= s["total_draft_tokens"]
        assert s["acceptance_rate"] == pytest.approx(s["total_accepted_draft_tokens"] / s["total_draft_tokens"])
        no_draft = client.generate(PROMPTS[2], 32, num_draft_tokens=0)
        assert no_draft.stats["total_draft_tokens"] == 0 and no_draft.text == long.text


def test_sampled_requests_with_draft_logits_are_reproducible_with_a_seed(served):
    """use_draft_logits: the draft returns generation_logits, the target accepts by rejection sampling on them."""
    with TritonLLMClient(served.grpc_url) as client:
        options = dict(temperature=0.9, top_k=20, seed=7, use_draft_logits=True)
        a = client.generate(PROMPTS[0], 24, **options)
        b = client.generate(PROMPTS[0], 24, **options)
        assert a.text == b.text and a.stats == b.stats
        assert a.stats["num_output_tokens"] == 24 and a.stats["total_draft_tokens"] > 0
        c = client.generate(PROMPTS[0], 24, **{**options, "seed": 8})
        assert c.stats["num_output_tokens"] == 24


def test_bad_requests_get_errors_and_the_server_keeps_serving(served, reference):
    import tritonclient.grpc as grpcclient

    with TritonLLMClient(served.grpc_url) as client:
        cases = [
            (dict(prompt="hello", max_tokens=0), "max_tokens must be"),  # the client's rule (trtspec.validation)
            (dict(prompt="hello", max_tokens=-3), "max_tokens must be"),
            (dict(prompt="hello " * 10, max_tokens=MAX_SEQ_LEN - 5), "exceeds max_seq_len"),
            (dict(prompt="hello " * 60, max_tokens=8), "more than max_input_len"),
            (dict(prompt=b"\xff\xfe not utf-8", max_tokens=8), "not valid UTF-8"),
            (dict(prompt="hello", max_tokens=8, num_draft_tokens=99), "num_draft_tokens"),
        ]
        for kwargs, message in cases:
            with pytest.raises(GenerationError, match=message):
                client.generate(kwargs.pop("prompt"), kwargs.pop("max_tokens"), **kwargs)
            assert served.is_ready()
        # A request without text_input: Triton itself refuses it.
        raw = grpcclient.InferenceServerClient(served.grpc_url)
        x = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[8]], dtype=np.int32))
        errors = []
        raw.start_stream(callback=lambda result, error: errors.append(error))
        raw.async_stream_infer("ensemble", [x])
        raw.stop_stream()
        raw.close()
        assert errors and errors[0] is not None and "text_input" in str(errors[0])
        assert served.is_ready()
        assert client.generate(PROMPTS[0], 12).text == reference(PROMPTS[0], 12)
    with TritonLLMClient(served.http_url, protocol="http") as client:
        with pytest.raises(GenerationError, match="max_tokens must be"):
            client.generate("hello", 0)
        assert client.generate(PROMPTS[0], 12).text == reference(PROMPTS[0], 12)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "trtspec", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def test_cli_generate_url_over_grpc_and_http_and_bench(served, reference, tmp_path):
    for url, protocol in ((served.grpc_url, "grpc"), (served.http_url, "http")):
        r = _cli("generate", PROMPTS[3], "--url", url, "--protocol", protocol, "--raw", "-n", "16", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["text"] == reference(PROMPTS[3], 16) and out["stats"]["total_draft_tokens"] > 0
    r = _cli("generate", "hi", "--url", "127.0.0.1:1", "--raw")
    assert r.returncode == 1 and "connection refused" in r.stderr and "Traceback" not in r.stderr
    plot = tmp_path / "bench.png"
    r = _cli(
        "bench",
        "--url",
        served.grpc_url,
        "-c",
        "1,2",
        "-n",
        "12",
        "--requests",
        "2",
        "--raw",
        "--json",
        "--plot",
        str(plot),
    )
    assert r.returncode == 0, r.stderr
    levels = json.loads(r.stdout)["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    for lv in levels:
        modes = {m["mode"]: m for m in lv["modes"]}
        assert modes["speculative"]["requests"] == 2 and modes["speculative"]["errors"] == 0
        assert modes["speculative"]["output_tok_per_s"] > 0 and modes["target_only"]["acceptance_rate"] is None
    assert plot.stat().st_size > 1000
