"""The OpenAI frontend's lifecycle is Triton's: `trtspec serve --openai-port` is ready only when both answer, SIGTERM
stops both, SIGKILL of `trtspec serve` takes both down; the frontend alone (the container's process) answers 503
while no Triton is ready; a taken port fails before Triton starts. During a drain the OpenAI API answers new requests
503 with Retry-After, /health and `trtspec probe` say not ready, a stream in flight finishes, then the process exits
and leaves no shared-memory region behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.openai_helpers import Served, with_chat_template
from tests.serving_helpers import serve_argv, torch_spec_dict

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def target(tiny_pair, tmp_path_factory) -> Path:
    return with_chat_template(tiny_pair[0], tmp_path_factory.mktemp("openai-life-models") / "target")


@pytest.fixture(scope="module")
def repo(target, tiny_pair, tmp_path_factory) -> Path:
    from trtspec.pipeline import write_repo
    from trtspec.spec import spec_from_dict

    root = tmp_path_factory.mktemp("openai-life")
    # max_seq_len 2048: a stream long enough (~1500 tokens) to be in flight while a drain is looked at
    data = torch_spec_dict(target, tiny_pair[1], name="life", engine={"max_seq_len": 2048})
    spec = spec_from_dict(data, base_dir=root, environ={})
    write_repo(spec)
    return spec.repo_dir


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _gone(pid: int, timeout_s: float = 30.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.2)
    return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_ready_only_with_both_and_sigterm_stops_both(repo, tmp_path):
    served = Served(repo, tmp_path / "server.log")
    try:
        ready = " ".join(served.output().split("ready:", 1)[1].split())  # the console wraps long lines
        assert f"OpenAI {served.base_url}" in ready
        assert served.health() == 200  # Triton was ready before the frontend said so
        assert httpx.get(served.base_url + "/models").json()["data"][0]["id"] == "life"
        (triton,) = [p for p in _children(served.proc.pid) if "tritonserver" in Path(f"/proc/{p}/cmdline").read_text()]
    finally:
        code = served.stop(signal.SIGTERM)
    assert code == 0, served.output()
    assert _gone(triton)
    assert not _listening(served.ports["openai"]) and not _listening(served.ports["grpc"])


def test_sigkill_of_trtspec_serve_takes_triton_down(repo, tmp_path):
    served = Served(repo, tmp_path / "server.log")
    try:
        (triton,) = [p for p in _children(served.proc.pid) if "tritonserver" in Path(f"/proc/{p}/cmdline").read_text()]
    finally:
        served.stop(signal.SIGKILL)
    assert _gone(triton)  # PR_SET_PDEATHSIG; the frontend was a thread of the killed process
    assert not _listening(served.ports["openai"])


def test_taken_openai_port_fails_before_triton_starts(repo, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run(
            serve_argv(repo, "--openai-port", str(port)),
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
    assert r.returncode == 1 and f"OpenAI port {port}" in r.stderr and "Traceback" not in r.stderr
    assert "ready:" not in r.stdout


def test_frontend_alone_answers_503_until_triton_is_ready(repo, tmp_path):
    """`python -m trtspec.serving.openai` (the container entrypoint's process) with no Triton behind it."""
    from trtspec.serving.server import free_port

    port, dead = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trtspec.serving.openai",
            "--repo",
            str(repo),
            "--triton",
            f"127.0.0.1:{dead}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        base = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 60
        while not _listening(port):
            assert proc.poll() is None and time.monotonic() < end, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        r = httpx.get(base + "/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
        r = httpx.post(
            base + "/v1/chat/completions",
            json={"model": "life", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable_error"
        assert httpx.get(base + "/v1/models").json()["data"][0]["id"] == "life"
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught (exit status of SIGTERM)
        assert proc.wait(30) in (0, -signal.SIGTERM)


KEY = "sk-drain-test"


def test_a_drain_refuses_new_requests_503_reports_not_ready_finishes_the_stream_and_exits(repo, target, tmp_path):
    import threading

    from tests.openai_helpers import Reference

    prompt, n = "The quick brown fox", 1500
    expected = Reference(target).complete(prompt, n)[0]
    # The key from the environment (TRTSPEC_API_KEY), the body limit from the option.
    # The drain deadline well past the stream's length (1500 tokens took 20-40 s on a loaded 2-core CI machine, and
    # the default 30 s cut it there once): this test is about the stream finishing, not about the deadline.
    args = ("--max-body-bytes", "65536", "--drain-timeout", "300")
    served = Served(repo, tmp_path / "server.log", env={"TRTSPEC_API_KEY": KEY}, args=args)
    auth = {"Authorization": f"Bearer {KEY}"}
    root = served.base_url[: -len("/v1")]
    try:
        assert httpx.get(served.base_url + "/models").status_code == 401
        big = {"model": "life", "prompt": "x" * 70_000, "max_tokens": 2}
        r = httpx.post(served.base_url + "/completions", json=big, headers=auth)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        out: dict = {"text": []}
        flowing = threading.Event()

        def stream() -> None:
            body = {"model": "life", "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True}
            body["stream_options"] = {"include_usage": True}
            try:
                with httpx.stream("POST", served.base_url + "/completions", json=body, headers=auth, timeout=300) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            chunk = json.loads(line[len("data: ") :])
                            out["text"].append(chunk["choices"][0]["text"] if chunk.get("choices") else "")
                            if chunk.get("choices"):
                                out["reason"] = chunk["choices"][0]["finish_reason"]
                            out["usage"] = chunk.get("usage")
                            flowing.set()
                        elif line == "data: [DONE]":
                            out["done"] = time.monotonic()
            finally:
                flowing.set()

        worker = threading.Thread(target=stream)
        worker.start()
        assert flowing.wait(120) and "done" not in out
        served.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 30
        while (health := httpx.get(root + "/health")).status_code == 200 and time.monotonic() < end:
            time.sleep(0.1)
        assert health.status_code == 503 and health.headers["retry-after"] == "5", health.text
        assert health.json()["error"]["code"] == "server_shutting_down"
        r = httpx.post(
            served.base_url + "/chat/completions",
            json={"model": "life", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            headers=auth,
        )
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json()["error"]["type"] == "service_unavailable_error"
        probe = subprocess.run(
            [sys.executable, "-m", "trtspec", "probe", "--url", served.grpc_url, "--timeout", "20"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        assert probe.returncode == 1 and "shutting down" in probe.stderr, probe.stderr
        assert worker.is_alive() or "done" in out
        worker.join(300)
        # Every token of it (greedy: its start is the target's own text; 1500 float32 steps may drift at the end)
        text = "".join(out["text"])
        assert out.get("reason") == "length" and out["usage"]["completion_tokens"] == n, served.output()[-3000:]
        assert text[:200] == expected[:200]
        assert served.proc.wait(60) == 0
        assert time.monotonic() - out["done"] < 30, "the process did not exit promptly after the drain"
    finally:
        served.stop()
    log = served.output()
    assert "drained in" in log and "1 in-flight request(s) finished" in log and "Traceback" not in log, log
    assert not list(Path("/dev/shm").glob(f"trtspec_{served.proc.pid}_*"))  # no region left behind


def test_the_frontend_alone_drains_on_sigusr1(repo, tmp_path):
    """The container entrypoint sends SIGUSR1 to `python -m trtspec.serving.openai` when the pod is told to stop."""
    from trtspec.serving.server import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "trtspec.serving.openai", "--repo", str(repo), "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--triton", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd(), "TRTSPEC_API_KEY": KEY},
    )
    try:
        end = time.monotonic() + 60
        while not _listening(port):
            assert proc.poll() is None and time.monotonic() < end
            time.sleep(0.2)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/health").json()["error"]["code"] == "model_not_ready"  # no Triton behind it
        proc.send_signal(signal.SIGUSR1)
        end = time.monotonic() + 10
        while httpx.get(base + "/health").json()["error"]["code"] != "server_shutting_down":
            assert time.monotonic() < end
            time.sleep(0.1)
        r = httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert httpx.get(base + "/v1/models").status_code == 401  # the key from the environment
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) in (0, -signal.SIGTERM)
