"""The OpenAI frontend's lifecycle is Triton's: `trtspec serve --openai-port` is ready only when both answer, SIGTERM
stops both, SIGKILL of `trtspec serve` takes both down; the frontend alone (the container's process) answers 503
while no Triton is ready; a taken port fails before Triton starts."""

from __future__ import annotations

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
def repo(tiny_pair, tmp_path_factory) -> Path:
    from trtspec.pipeline import write_repo
    from trtspec.spec import spec_from_dict

    root = tmp_path_factory.mktemp("openai-life")
    target = with_chat_template(tiny_pair[0], root / "target")
    spec = spec_from_dict(torch_spec_dict(target, tiny_pair[1], name="life"), base_dir=root, environ={})
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
