"""One set of request rules on every path, URLs that mean what they say, and one-line messages that are right
(issue 13, items 5-8): each through the real CLI in a subprocess, with nothing listening or no server needed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import yaml

TRTSPEC = [sys.executable, "-m", "trtspec"]


def run(*args, cwd=None, env=None, timeout=300):
    return subprocess.run(
        [*TRTSPEC, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env={**os.environ, **(env or {})}
    )


@pytest.fixture()
def closed_port():
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _errors(r) -> list[str]:
    return [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "-1"], "temperature must be >= 0, got -1.0"),
        (["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--top-k", "-3"], "top_k must be >= 0, got -3"),
        (["--seed", "-1"], "seed must be in 0..2**64-1, got -1"),
        (["-n", "0"], "max_tokens must be >= 1, got 0"),
        (["--num-draft-tokens", "17"], "num_draft_tokens must be in 0..16, got 17"),
    ],
)
def test_url_requests_follow_the_in_process_rules_before_anything_is_sent(closed_port, args, message):
    # Nothing listens on the port: an error about the request proves it was judged before any connection.
    r = run("generate", "hello", "--url", f"127.0.0.1:{closed_port}", *args)
    assert r.returncode == 1 and _errors(r) == [f"error: {message}"], r.stderr
    assert "connection refused" not in r.stderr


def test_bench_refuses_zero_tokens_before_any_request(closed_port):
    r = run("bench", "--url", f"127.0.0.1:{closed_port}", "-n", "0")
    assert r.returncode == 1 and _errors(r) == ["error: max_tokens must be >= 1, got 0"], r.stderr
    r = run("bench", "--url", f"127.0.0.1:{closed_port}", "--requests", "-2")
    assert r.returncode == 1 and "--requests must be >= 0" in r.stderr


def test_nothing_listening_says_connection_refused(closed_port):
    for url in (f"127.0.0.1:{closed_port}", f"http://127.0.0.1:{closed_port}"):
        r = run("generate", "hello", "--url", url)
        assert r.returncode == 1
        assert _errors(r) == [f"error: nothing is listening at 127.0.0.1:{closed_port} (connection refused)"]
        assert "no ready model" not in r.stderr and "Traceback" not in r.stderr


def test_url_scheme_decides_the_protocol_and_a_missing_port_is_the_default():
    from trtspec.serving.endpoints import parse_url

    assert parse_url("http://127.0.0.1:8000").protocol == "http"
    assert parse_url("grpc://host").port == 8001 and parse_url("host").port == 8001
    assert parse_url("http://host").port == 8000 and parse_url("host", "http").port == 8000
    assert parse_url("https://host").tls and parse_url("https://host").url == "https://host:8000"
    assert parse_url("[::1]:9001").address == "[::1]:9001"
    r = run("generate", "hello", "--url", "localhost")
    assert r.returncode == 1 and "localhost:8001" in r.stderr  # whatever answers (or not) on the default port
    r = run("generate", "hello", "--url", "http://localhost", "--protocol", "grpc")
    assert r.returncode == 1 and _errors(r) == ["error: --url http://localhost is HTTP but --protocol is grpc"]
    for bad, message in (
        ("ftp://h:1", "unsupported scheme ftp://"),
        ("http://h:1/v2", "with no path"),
        ("h:99999", "the port is not a number"),
    ):
        r = run("generate", "hello", "--url", bad)
        assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr, bad


def test_a_dropped_grpc_stream_is_a_server_error_not_a_request_error():
    from tritonclient.utils import InferenceServerException

    from trtspec.errors import GenerationError, ServerError
    from trtspec.serving.endpoints import stream_error

    dropped = stream_error(InferenceServerException("Socket closed", status="StatusCode.UNAVAILABLE"), "grpc://h:1")
    assert isinstance(dropped, ServerError) and "dropped the connection" in dropped.message
    assert "check the request fields" not in dropped.hint and "log" in dropped.hint
    refused = stream_error(
        InferenceServerException("max_tokens must be >= 1", status="StatusCode.INVALID_ARGUMENT"), "grpc://h:1"
    )
    assert isinstance(refused, GenerationError) and "refused this request" in refused.hint


def _spec(tmp_path, target, draft):
    path = tmp_path / "trtspec.yaml"
    path.write_text(
        yaml.safe_dump(
            {"target": {"model": str(target), "dtype": "float32"}, "draft": {"model": str(draft), "dtype": "float32"}}
        )
    )
    return path


@pytest.fixture()
def mismatched(tiny_pair, tmp_path):
    """The tiny pair, with a draft whose tokenizer maps one id to another token (same vocabulary size)."""
    from tests.tiny import perturb_tokenizer

    return _spec(tmp_path, tiny_pair[0], perturb_tokenizer(tiny_pair[1], tmp_path / "bad", 42, "XX-odd"))


def test_repo_refuses_a_draft_with_another_tokenizer_and_writes_nothing(tmp_path, mismatched):
    r = run("repo", str(mismatched), cwd=tmp_path)
    assert r.returncode == 1 and len(_errors(r)) == 1, r.stderr
    assert _errors(r)[0].startswith("error: token-to-id mapping: tokenizers differ at token id 42")
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "triton_repo").exists() and not list(tmp_path.glob(".tmp-*"))


def test_generate_in_process_refuses_a_draft_with_another_tokenizer(mismatched):
    r = run("generate", "hello", "--spec", str(mismatched), "-n", "4")
    assert r.returncode == 1 and "token-to-id mapping: tokenizers differ at token id 42" in r.stderr
    assert "loading models" not in r.stderr
    plain = run("generate", "hello", "--spec", str(mismatched), "-n", "4", "--raw", "--no-draft")
    assert plain.returncode == 0, plain.stderr  # target-only decoding never meets the draft


def test_generate_no_draft_titles_its_table_target_only(tiny_pair, tmp_path):
    spec = _spec(tmp_path, *tiny_pair)
    r = run("generate", "The quick", "--spec", str(spec), "-n", "4", "--raw", "--no-draft")
    assert r.returncode == 0 and "target only" in r.stderr and "speculative decoding" not in r.stderr
    r = run("generate", "The quick", "--spec", str(spec), "-n", "4", "--raw", "--draft-len", "2")  # the old name
    assert r.returncode == 0 and "speculative decoding (K = 2)" in r.stderr


def test_serve_on_a_directory_that_is_no_repository_leaves_nothing_and_says_so(tmp_path):
    empty = tmp_path / "not-a-repo"
    empty.mkdir()
    r = run("serve", str(empty), cwd=tmp_path)
    assert r.returncode == 1
    assert _errors(r) == [f"error: {empty}: not a Triton model repository (no <model>/config.pbtxt in it)"]
    assert "stopping tritonserver" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-repo"] and not any(empty.iterdir())


def test_serve_on_a_busy_port_hints_at_0_for_a_free_one(tmp_path):
    repo = tmp_path / "repo" / "m"
    repo.mkdir(parents=True)
    (repo / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run("serve", str(tmp_path / "repo"), "--http-port", str(port))
    assert r.returncode == 1 and f"http port {port} is already in use" in r.stderr
    assert "or 0 to pick a free one" in r.stderr and "omit it" not in r.stderr
    assert "stopping tritonserver" not in r.stderr and not list(tmp_path.glob("*.log"))


def test_speedup_verdict_says_plainly_whether_speculation_paid_and_why():
    from trtspec.serving.verdict import speedup_verdict

    def level(spec_tps, base_tps, acceptance):
        return {
            "concurrency": 1,
            "speculative": {"output_tok_per_s": spec_tps, "acceptance_rate": acceptance},
            "target_only": {"output_tok_per_s": base_tps, "acceptance_rate": 0.0},
        }

    slow = speedup_verdict(level(9.0, 10.0, 0.2), max_draft_len=4)
    assert slow.startswith("speculative decoding did not pay on this machine: 0.90x target-only")
    assert "kept 20% of the proposals (up to 4 a step)" in slow
    assert "about 1.8 tokens" in slow and "2.0 target steps" in slow
    assert speedup_verdict(level(20.0, 10.0, 0.6), 4).startswith("speculative decoding paid on this machine: 2.00x")
    assert "no measurable difference" in speedup_verdict(level(10.2, 10.0, 0.3), 4)
    routed = speedup_verdict(level(9.5, 10.0, 0.0), 4, route_threshold=16, max_tokens=8)
    assert "No draft tokens were proposed" in routed
    assert speedup_verdict({"speculative": {"output_tok_per_s": 1.0}}) is None
