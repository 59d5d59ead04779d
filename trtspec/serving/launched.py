"""The image's server: the repository's launch (trtspec.serving.launch: mpirun ... tritonserver, or one tritonserver)
run as a child and supervised like ``trtspec serve`` supervises a local server: drain on SIGTERM, the stub watch,
the model reload (trtspec.serving.lifecycle). Its output goes to the container's (no log file of its own).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from trtspec.errors import ServerError
from trtspec.serving.lifecycle import ControlDir, drain, reload_model, supervise
from trtspec.serving.shm import SERVER_UMASK, protect_shm_regions, remove_shm_regions

STOP_TIMEOUT_S = 30.0  # after the drain: Triton unloads its models (engines take a while), then SIGKILL


class LaunchedServer:
    """The launch as a child process, with the interface ``lifecycle.supervise`` drives."""

    def __init__(
        self,
        repo: Path,
        launch: Any,
        repository_key: str = "",
        ready_timeout_s: float | None = None,
        model_control: bool | None = None,
    ) -> None:
        self.repo = Path(repo)
        self.launch = launch
        self.repository_key = repository_key
        self.model_control = bool(repository_key) if model_control is None else model_control
        # Two engines load for minutes; the pod's startupProbe bounds it from outside.
        self.ready_timeout_s = ready_timeout_s or float(os.environ.get("TRTSPEC_READY_TIMEOUT", "3600"))
        port = next((a.split("=", 1)[1] for a in launch.argv if a.startswith("--http-port=")), "8000")
        self.http_url = f"127.0.0.1:{port}"
        self.log_file = "the container log"
        self.control: ControlDir | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def log_tail(self) -> str:
        return "(see the container log above)"

    def start(self) -> LaunchedServer:
        self.control = ControlDir()
        env = {**os.environ, **self.launch.env, **self.control.env()}
        self._proc = subprocess.Popen(self.launch.argv, env=env, start_new_session=True, umask=SERVER_UMASK)
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, abort: Any = None) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline and not (abort and abort()):
            if self.exit_code() is not None:
                raise ServerError(
                    f"the launch exited with code {self.exit_code()} before it was ready",
                    hint="the container log above says why",
                )
            self.protect_shm()
            if self.is_ready():
                self.protect_shm()
                return
            time.sleep(0.25)
        if not (abort and abort()):
            raise ServerError(
                f"the server was not ready within {self.ready_timeout_s:.0f} s",
                hint="raise TRTSPEC_READY_TIMEOUT, or read the log",
            )

    def reload_model(self, model: str, timeout_s: float = 600.0) -> None:
        reload_model(self.http_url, model, self.repository_key, timeout_s)

    def drain(self, timeout_s: float, abort: Any = None) -> Any:
        assert self.control is not None
        return drain(self.control, timeout_s, exited=lambda: self.exit_code() is not None or bool(abort and abort()))

    def stop(self) -> int | None:
        """SIGTERM to the launch (mpirun passes it to the ranks), SIGKILL to its process group after a timeout."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if self.control is not None:
            self.control.remove()
            self.control = None
        for prefix in self.shm_prefixes():
            remove_shm_regions(prefix)
        return proc.returncode

    def protect_shm(self) -> None:
        for prefix in self.shm_prefixes():
            protect_shm_regions(prefix)

    def shm_prefixes(self) -> list[str]:
        """The Python backend's region prefixes of the launch (one per rank; Triton's default without one)."""
        found = [a.split("shm-region-prefix-name=", 1)[1] for a in self.launch.argv if "shm-region-prefix-name=" in a]
        return found or ["triton_python_backend_shm_region_"]

    def restart(self) -> LaunchedServer:
        self.stop()
        self.start()
        self.wait_ready()
        return self


def run_supervised(
    repo: Path, launch: Any, *, drain_timeout_s: float, repository_key: str = "", watch: bool = True
) -> int:
    """Run the launch until SIGTERM/SIGINT (then drain and stop it) or until it exits; its exit code (0 after a
    drain, 1 when it could not serve and did not exit by itself)."""
    server = LaunchedServer(repo, launch, repository_key, model_control=watch and bool(repository_key))
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signum)
        stop.set()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)

    def say(line: str) -> None:
        sys.stdout.write(f"[trtspec] {line}\n")
        sys.stdout.flush()

    server.start()
    code: int | None = None
    try:
        server.wait_ready(abort=stop.is_set)

        def say_ready() -> None:
            if not stop.is_set():
                say(f"ready (HTTP {server.http_url}); SIGTERM drains for up to {drain_timeout_s:g} s")

        supervise(server, stop, say, watch=watch, started=say_ready)
        if server.exit_code() is None:
            say(f"draining: new requests are refused, in-flight ones have {drain_timeout_s:g} s")
            say(server.drain(drain_timeout_s, abort=lambda: len(signals) > 1).line())
    except ServerError as exc:
        say(f"error: {exc.message}")
        code = server.exit_code() or 1  # the launch's own code when it exited (what a pod's restart policy sees)
    finally:
        rc = server.stop()
    return code if code is not None else (0 if signals else (rc or 0))
