"""A dead model stub is noticed (real tritonserver, the tiny pair): `trtspec serve` reports it in one line, the
server is not ready while it is replaced, and it serves again; `trtspec probe` fails while generation is broken,
though Triton's health endpoints stay 200 (Triton 2.51: nothing notices, nothing restarts it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.serving_helpers import Serve, torch_spec_dict
from trtspec.serving.client import TritonLLMClient
from trtspec.serving.stubs import StubWatch, expected_stubs, stub_processes
from trtspec.spec import spec_from_dict

pytestmark = [pytest.mark.triton, pytest.mark.slow]


@pytest.fixture(scope="module")
def repo(tiny_pair, tmp_path_factory):
    from trtspec.pipeline import write_repo

    root = tmp_path_factory.mktemp("stubs")
    # The orchestrator's stub is the one that died under load (BLS); the in-process model is watched the same way.
    spec = spec_from_dict(torch_spec_dict(*tiny_pair, triton={"orchestration": "bls"}), base_dir=root, environ={})
    return write_repo(spec)["path"]


def _server_pid(serve: Serve) -> int:
    out = subprocess.run(["pgrep", "-P", str(serve.proc.pid), "-f", "tritonserver"], capture_output=True, text=True)
    return int(out.stdout.split()[0])


def _probe(url: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trtspec", "probe", "--url", url, "--timeout", str(timeout)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def _read_until(stream, needle: str, timeout: float = 180.0) -> str:
    """Lines of ``stream`` up to the one containing ``needle`` (a reader thread: readline blocks)."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in iter(stream.readline, "")], daemon=True).start()
    seen = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            continue
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"{needle!r} not seen within {timeout} s:\n{''.join(seen)}")


def test_every_python_model_runs_its_configured_number_of_stubs(repo):
    from trtspec.serving.server import TritonServer

    with TritonServer(repo) as server:
        watch = StubWatch(server.pid, expected_stubs(repo))
        assert watch.missing() == {} and watch.check() == []
        running = sorted(s.instance for s in stub_processes(server.pid).values())
        assert running == sorted(f"{m}_0_{i}" for m, n in expected_stubs(repo).items() for i in range(n))


@pytest.mark.parametrize("model", ["tensorrt_llm_bls", "tensorrt_llm"])
def test_a_killed_stub_is_reported_and_its_model_serves_again(repo, model):
    serve = Serve(repo)
    try:
        with TritonLLMClient(serve.grpc_url) as client:
            before = client.generate("The quick brown fox", 8).text
        server_pid = _server_pid(serve)
        (victim,) = [p for p, s in stub_processes(server_pid).items() if s.model == model]
        os.kill(victim, signal.SIGSEGV)
        seen = _read_until(serve.proc.stderr, "ready again")
        assert f"model stub {model}_0_0 (model {model}, pid {victim}) killed by SIGSEGV" in seen, seen
        assert f"reloaded {model}" in seen, seen
        assert _probe(serve.grpc_url).returncode == 0
        with TritonLLMClient(serve.grpc_url) as client:
            assert client.generate("The quick brown fox", 8).text == before
        assert [s for s in stub_processes(server_pid).values() if s.model == model and not s.zombie]
    finally:
        serve.kill()


def test_the_probe_fails_while_generation_is_broken_though_triton_reports_ready(repo):
    serve = Serve(repo, "--no-stub-watch")
    try:
        ok = _probe(serve.grpc_url)
        assert ok.returncode == 0 and "generated" in ok.stdout, ok.stderr
        server_pid = _server_pid(serve)
        (victim,) = [p for p, s in stub_processes(server_pid).items() if s.model == "tensorrt_llm_bls"]
        os.kill(victim, signal.SIGSEGV)
        time.sleep(1.0)
        broken = _probe(serve.grpc_url, timeout=5)
        assert broken.returncode == 1 and "probe of grpc://" in broken.stderr, broken.stderr
        assert "Traceback" not in broken.stderr
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(serve.grpc_url)
        assert client.is_server_ready() and client.is_model_ready("tensorrt_llm_bls")  # what Triton 2.51 says
        client.close()
    finally:
        serve.kill()
