"""`trtspec generate --url` and `trtspec bench` against a real Triton server serving the tiny pair (issue 13): the
URL's scheme picks the protocol, a wrong port says so, K is bounded by the deployment's max_draft_len as in process, a
dropped stream is the server's error, and bench says in one sentence whether speculation paid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.serving_helpers import make_noisy_draft, torch_spec_dict
from trtspec.spec import spec_from_dict

pytestmark = pytest.mark.triton


def run(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "trtspec", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _repo(tiny_pair, root):
    from trtspec.pipeline import write_repo

    draft = make_noisy_draft(tiny_pair[0], root / "draft")
    spec = spec_from_dict(
        torch_spec_dict(tiny_pair[0], draft, speculative={"route_threshold": 8}), base_dir=root, environ={}
    )
    write_repo(spec)
    return spec.repo_dir


@pytest.fixture(scope="module")
def served(tiny_pair, tmp_path_factory):
    from trtspec.serving.server import TritonServer

    root = tmp_path_factory.mktemp("served-cli")
    with TritonServer(_repo(tiny_pair, root), log_file=root / "server.log") as server:
        yield server


def test_the_url_scheme_picks_the_protocol(served):
    grpc = run("generate", "The quick", "--url", served.grpc_url, "-n", "12", "--raw", "--json")
    http = run("generate", "The quick", "--url", f"http://{served.http_url}", "-n", "12", "--raw", "--json")
    assert grpc.returncode == 0 and http.returncode == 0, grpc.stderr + http.stderr
    assert json.loads(http.stdout)["text"] == json.loads(grpc.stdout)["text"]
    table = run("generate", "The quick", "--url", f"http://{served.http_url}", "-n", "4", "--raw", "--no-draft")
    assert table.returncode == 0
    assert f"target only, served by http://{served.http_url}" in " ".join(table.stderr.split())


def test_the_wrong_port_for_the_protocol_says_so(served):
    r = run("generate", "hello", "--url", f"grpc://{served.http_url}")
    assert r.returncode == 1 and "accepts connections but does not answer GRPC" in r.stderr
    assert "is this its HTTP port?" in r.stderr
    r = run("generate", "hello", "--url", f"http://{served.grpc_url}")
    assert r.returncode == 1 and "does not answer HTTP" in r.stderr and "no ready model" not in r.stderr


def test_k_above_the_deployments_max_draft_len_is_refused_as_in_process(served):
    r = run("generate", "hello", "--url", served.grpc_url, "-k", "9")
    assert r.returncode == 1 and "num_draft_tokens must be in 0..4, got 9" in r.stderr
    assert "max_draft_len is 4" in r.stderr


def test_a_missing_model_lists_the_ready_ones(served):
    from trtspec.errors import ServerError
    from trtspec.serving.client import TritonLLMClient

    with TritonLLMClient(served.grpc_url, model="nope") as client, pytest.raises(ServerError) as err:
        client.check_ready()
    assert "has no ready model 'nope' (ready: ensemble," in err.value.message


def test_bench_says_whether_speculation_paid(served):
    r = run("bench", "--url", served.grpc_url, "-c", "1", "--requests", "2", "-n", "16", "--raw")
    assert r.returncode == 0, r.stderr
    verdict = [ln for ln in r.stdout.splitlines() if ln.startswith("speculative decoding ")]
    assert verdict and "x target-only" in verdict[0], r.stdout
    assert any(w in verdict[0] for w in ("paid on this machine", "did not pay", "no measurable difference"))


# gRPC only: over HTTP, Triton 2.51's generate_stream of a killed server ends like a complete stream (seen here: the
# client got a clean end of body), and the ensemble contract has no final flag the client could check.
@pytest.mark.parametrize("scheme", ["grpc"])
def test_a_stream_the_server_drops_is_a_server_error(tiny_pair, tmp_path, scheme):
    from trtspec.serving.server import TritonServer

    server = TritonServer(_repo(tiny_pair, tmp_path), log_file=tmp_path / "server.log").start()
    try:
        url = f"{scheme}://{server.grpc_url if scheme == 'grpc' else server.http_url}"
        cmd = ["generate", "The quick brown fox", "--url", url, "--raw", "--stream", "-n", "480", "--no-draft"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "trtspec", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stdout.read(1)  # the stream has started
        os.killpg(server.pid, signal.SIGKILL)  # the server dies mid-stream (no drain)
        _, err = proc.communicate(timeout=120)
    finally:
        time.sleep(0.2)
        server.stop()
    assert proc.returncode == 1, err
    assert "dropped the connection mid-request" in err and "check the request fields" not in err
    assert "log" in err.split("hint:", 1)[1]
