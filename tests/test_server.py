"""The tritonserver lifecycle on a trivial repository: readiness with a deadline, the log, clean stop, no orphans,
clear failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.serving_helpers import serve_argv
from trtspec.errors import ServerError
from trtspec.serving.server import Ports, TritonServer, free_port

pytestmark = pytest.mark.triton

ECHO = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.environ["TRTSPEC_PYTHONPATH"])  # what the repository's model.py files do
    import triton_python_backend_utils as pb_utils
    class TritonPythonModel:
        def initialize(self, args):
            import trtspec  # this very checkout of trtspec, and this environment's numpy < 2
            import numpy
            assert trtspec.__file__.startswith(os.environ["TRTSPEC_PYTHONPATH"] + "/"), trtspec.__file__
            assert int(numpy.__version__.split(".")[0]) < 2
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X")
                    .as_numpy())]) for r in requests]
""")
CONFIG = textwrap.dedent("""
    name: "echo"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
""")


def echo_repo(root: Path, broken: bool = False) -> Path:
    model = root / "repo" / "echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(
        ECHO.replace("import trtspec", "raise RuntimeError('broken model')") if broken else ECHO
    )
    return root / "repo"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_server_starts_answers_and_stops_with_its_stubs(tmp_path):
    import numpy as np
    import tritonclient.http as httpclient

    with TritonServer(echo_repo(tmp_path), log_file=tmp_path / "server.log") as server:
        assert server.is_ready()
        client = httpclient.InferenceServerClient(server.http_url)
        x = httpclient.InferInput("X", [3], "INT32")
        x.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
        assert client.infer("echo", [x]).as_numpy("Y").tolist() == [1, 2, 3]
        client.close()
        pid = server.pid
        group = [
            int(p) for p in subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
        ]
        assert len(group) >= 2  # tritonserver and the Python stub
    assert not any(_alive(p) for p in group)
    assert "Started GRPCInferenceService" in (tmp_path / "server.log").read_text()


def test_server_dies_with_its_parent(tmp_path):
    """PR_SET_PDEATHSIG: a parent killed with SIGKILL (no clean-up code runs) still takes the server with it."""
    repo = echo_repo(tmp_path)
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from trtspec.serving.server import TritonServer
        s = TritonServer(Path({str(repo)!r}), log_file=Path({str(tmp_path / "child.log")!r})).start()
        print(s.pid, flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}
    )
    try:
        pid = int(child.stdout.readline())
        assert _alive(pid)
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid)
    finally:
        child.kill()


def test_a_model_that_fails_to_load_is_a_server_error_with_the_log(tmp_path):
    with pytest.raises(ServerError, match="broken model"):
        TritonServer(echo_repo(tmp_path, broken=True), ready_timeout_s=120).start()


def test_busy_port_and_missing_repository_are_refused(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(ServerError, match=f"port {busy} is already in use"):
            Ports.pick(http=busy)
    with pytest.raises(ServerError, match="no such model repository"):
        TritonServer(tmp_path / "nothing")
    ports = Ports.pick(grpc=free_port())
    assert len({ports.http, ports.grpc, ports.metrics}) == 3


def test_a_non_decoupled_repository_answers_and_refuses_streaming(tiny_pair, tmp_path):
    from tests.serving_helpers import torch_spec_dict
    from trtspec.errors import GenerationError
    from trtspec.pipeline import write_repo
    from trtspec.serving.client import TritonLLMClient
    from trtspec.spec import spec_from_dict

    spec = spec_from_dict(
        torch_spec_dict(tiny_pair[0], tiny_pair[0], triton={"decoupled": False}), base_dir=tmp_path, environ={}
    )
    write_repo(spec)
    with TritonServer(spec.repo_dir) as server:
        for url, protocol in ((server.grpc_url, "grpc"), (server.http_url, "http")):
            with TritonLLMClient(url, protocol=protocol) as client:
                r = client.generate("The quick brown fox", 16)
                # The target is its own draft here: every draft token is accepted.
                assert r.stats["num_output_tokens"] == 16 and r.stats["acceptance_rate"] == 1.0
                with pytest.raises(GenerationError, match="decoupled"):
                    client.generate("The quick brown fox", 16, stream=True)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_serve_runs_until_ctrl_c_or_sigterm_and_takes_the_server_down(tmp_path, sig):
    repo = echo_repo(tmp_path)
    proc = subprocess.Popen(
        serve_argv(repo, "--log-file", str(tmp_path / "s.log")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd(), "COLUMNS": "200"},
    )
    try:
        line = ""
        while "ready:" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, proc.stderr.read()
        children = [
            int(p)
            for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        ]
        assert children and all(_alive(p) for p in children)
        proc.send_signal(sig)
        assert proc.wait(60) == 0
        assert not any(_alive(p) for p in children)
    finally:
        proc.kill()


def test_two_servers_on_one_machine_use_their_own_python_backend_shared_memory(tmp_path):
    import numpy as np
    import tritonclient.http as httpclient

    repo = echo_repo(tmp_path)
    with TritonServer(repo, log_file=tmp_path / "a.log") as a, TritonServer(repo, log_file=tmp_path / "b.log") as b:
        assert a.shm_prefix != b.shm_prefix
        for server in (a, b):
            assert f"--backend-config=python,shm-region-prefix-name={server.shm_prefix}" in server.command()
            regions = [p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(server.shm_prefix)]
            assert regions, f"no shared-memory region named {server.shm_prefix}*"
            client = httpclient.InferenceServerClient(server.http_url)
            x = httpclient.InferInput("X", [2], "INT32")
            x.set_data_from_numpy(np.array([4, 5], dtype=np.int32))
            assert client.infer("echo", [x]).as_numpy("Y").tolist() == [4, 5]
            client.close()
