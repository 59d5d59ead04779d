"""The tritonserver process: start it on free ports, wait for readiness, keep its log, stop it, never orphan it.

The binary is one on PATH or the one bundled in ``nvidia-pytriton`` (Triton 2.51 with the standard Python backend).
The bundled Python backend ships its stub per Python version; we assemble a private backend directory (stub for this
interpreter + the backend library) under trtspec's cache instead of writing into site-packages, and point the stub at
this interpreter's libpython, its environment (PATH) and trtspec (TRTSPEC_PYTHONPATH, read by the repository's
model.py files: the stub's embedded interpreter ignores PYTHONPATH).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.errors import ServerError
from trtspec.paths import trtspec_import_root
from trtspec.procs import die_with_parent
from trtspec.serving.shm import SERVER_UMASK, protect_shm_regions, remove_shm_regions
from trtspec.threads import set_wait_policy

READY_PATH = "/v2/health/ready"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def pick(cls, http: int | None = None, grpc: int | None = None, metrics: int | None = None) -> Ports:
        """Given ports are checked to be free; missing ones are picked free (all distinct)."""
        chosen: list[int] = []
        for name, port in (("http", http), ("grpc", grpc), ("metrics", metrics)):
            if port is None:
                port = free_port()
                while port in chosen:
                    port = free_port()
            elif not port_is_free(port):
                raise ServerError(
                    f"{name} port {port} is already in use", hint=f"pass another --{name}-port, or 0 to pick a free one"
                )
            chosen.append(port)
        if len(set(chosen)) != 3:
            raise ServerError(
                f"ports must differ (http {chosen[0]}, grpc {chosen[1]}, metrics {chosen[2]})",
                hint="give three different ports",
            )
        return cls(*chosen)


# -- the local binary and its Python backend --------------------------------------------------------------------
def _pytriton_root() -> Path | None:
    import importlib.util

    found = importlib.util.find_spec("pytriton")
    if found is None or not found.submodule_search_locations:
        return None
    return Path(list(found.submodule_search_locations)[0])


def find_server_binary() -> Path:
    """tritonserver on PATH, else the one bundled in nvidia-pytriton."""
    from trtspec.build.toolchain import find_tritonserver

    found = find_tritonserver()
    if found is None:
        raise ServerError(
            "no tritonserver binary: none on PATH and nvidia-pytriton is not installed",
            hint="pip install 'trtspec[serve]' (bundles Triton 2.51), or use --docker IMAGE",
        )
    return Path(found)


def _check_numpy() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        major = int(version("numpy").split(".")[0])
    except PackageNotFoundError:
        raise ServerError(
            "numpy is not installed in this environment, which the Python backend runs", hint="pip install 'numpy<2'"
        ) from None
    if major >= 2:
        # numpy 2 crashes the bundled Python backend stub on the first BYTES tensor.
        raise ServerError(
            f"numpy {version('numpy')} is installed; Triton's bundled Python backend needs numpy < 2",
            hint="pip install 'numpy<2'",
        )


def python_backend_dir(cache: Path | None = None) -> Path:
    """A backends directory whose ``python/`` holds the bundled backend plus the stub for this interpreter.

    Assembled once per pytriton version and Python version under the cache, atomically.
    """
    from importlib.metadata import version

    root = _pytriton_root()
    if root is None:
        raise ServerError(
            "nvidia-pytriton is not installed: no Python backend for the local server",
            hint="pip install 'trtspec[serve]'",
        )
    pyver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = root / "tritonserver" / "python_backend_stubs" / pyver / "triton_python_backend_stub"
    backend = root / "tritonserver" / "backends" / "python"
    if not stub.is_file():
        raise ServerError(
            f"nvidia-pytriton has no Python backend stub for Python {pyver}",
            hint="use Python 3.8-3.13, or a tritonserver on PATH with its own Python backend",
        )
    if cache is None:
        from trtspec.paths import cache_dir

        cache = cache_dir()
    final = cache / "triton-backends" / f"pytriton-{version('nvidia-pytriton')}-py{pyver}"
    if (final / "python" / "triton_python_backend_stub").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "python").mkdir(parents=True)
    for f in backend.iterdir():
        if f.is_file():
            shutil.copy2(f, tmp / "python" / f.name)
    shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
    try:
        tmp.rename(final)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def server_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver and its Python stubs: this interpreter's libpython, venv and trtspec."""
    env = dict(os.environ if base is None else base)
    libdirs = [sysconfig.get_config_var("LIBDIR") or ""]
    root = _pytriton_root()
    if root is not None:
        libdirs.append(str(root.parent / "nvidia_pytriton.libs"))
    if env.get("LD_LIBRARY_PATH"):
        libdirs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(p for p in libdirs if p)
    # The stub's embedded interpreter finds its prefix (and so the venv's site-packages) from `python3` on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # The stub's embedded interpreter ignores PYTHONPATH; the repository's model.py files read this one.
    # TRTSPEC_EXTRA_PYTHONPATH: more import roots for the Python models (custom code, or a test's stand-in modules).
    extra = [p for p in env.get("TRTSPEC_EXTRA_PYTHONPATH", "").split(os.pathsep) if p]
    env["TRTSPEC_PYTHONPATH"] = os.pathsep.join([str(trtspec_import_root()), *extra])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Draft and target run in separate stubs that take turns on the same cores: OpenMP threads that spin after a
    # parallel region steal the other model's CPU (measured: a 10-token speculative request 4.5x slower; see
    # trtspec.threads for the in-process figures).
    set_wait_policy(env)
    return env


@dataclass
class TritonServer:
    """A local tritonserver serving ``repo``: a context manager that starts it and always stops it.

    ``with TritonServer(repo) as server: server.grpc_url`` -- ports are picked free unless given. The server gets
    SIGKILL when the thread that started it exits (PR_SET_PDEATHSIG), so start it from a thread that outlives it.
    """

    repo: Path
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    log_file: Path | None = None
    ready_timeout_s: float = 180.0
    stop_timeout_s: float = 15.0
    binary: Path | None = None
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"
    env: Mapping[str, str] = field(default_factory=dict)  # applied last to the server's environment
    # Explicit model control, its repository API behind a per-server key: what lets the stub watch reload a model.
    model_control: bool = False
    ports: Ports = field(init=False)
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _log: object = field(default=None, init=False, repr=False)
    control: Any = field(default=None, init=False, repr=False)  # lifecycle.ControlDir shared with the models
    repository_key: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        self.repo = Path(self.repo).resolve()
        if not self.repo.is_dir():
            raise ServerError(f"{self.repo}: no such model repository", hint="`trtspec repo` writes one")
        self.ports = Ports.pick(self.http_port, self.grpc_port, self.metrics_port)
        if self.log_file is None:
            self.log_file = self.repo.parent / f"tritonserver-{self.ports.http}.log"

    @property
    def _local(self) -> str:
        """The address a client on this machine connects to (a wildcard listen address is reached via loopback)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    @property
    def http_url(self) -> str:
        return f"{self._local}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self._local}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._local}:{self.ports.metrics}/metrics"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def exit_code(self) -> int | None:
        """The server's exit code if it has exited on its own, else None."""
        return self._proc.poll() if self._proc is not None else None

    def command(self, backend_dir: Path | None = None) -> list[str]:
        """The tritonserver command line."""
        binary = self.binary or find_server_binary()
        cmd = [
            str(binary),
            f"--model-repository={self.repo}",
            f"--http-address={self.host}",
            f"--http-port={self.ports.http}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.ports.metrics}",
            "--allow-gpu-metrics=false",
            "--strict-readiness=true",
            "--exit-timeout-secs=10",
            "--log-verbose=0",
        ]
        if backend_dir is not None:
            cmd.append(f"--backend-directory={backend_dir}")
        # The Python backend names its shared-memory regions from this prefix; two servers on one machine with the
        # default prefix collide (seen: boost::interprocess::lock_exception at start while another server ran).
        cmd.append(f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}")
        from trtspec.serving.lifecycle import model_control_args, restricted_api_args

        if not self.repository_key:  # the per-server key of every control API (not needed to generate)
            import secrets

            self.repository_key = secrets.token_hex(16)
        cmd += (model_control_args if self.model_control else restricted_api_args)(self.repository_key)
        return cmd + list(self.extra_args)

    @property
    def shm_prefix(self) -> str:
        """This server's Python-backend shared-memory prefix: unique per process and HTTP port."""
        return f"trtspec_{os.getpid()}_{self.ports.http}_"

    def start(self) -> TritonServer:
        """Start the server and wait until it is ready (or raise ServerError with the log's tail)."""
        if self._proc is not None:
            raise ServerError("this server is already started", hint="stop() it first")
        _check_numpy()
        binary = self.binary or find_server_binary()
        bundled = _pytriton_root() is not None and str(binary).startswith(str(_pytriton_root()))
        cmd = self.command(python_backend_dir() if bundled else None)
        assert self.log_file is not None
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_file, "wb")
        env = server_environment()
        from trtspec.serving.docker import repo_mounts

        env.update(repo_mounts(self.repo)[1])  # e.g. TRTLLM_ORCHESTRATOR=1 for two engines in one server
        from trtspec.serving.lifecycle import ControlDir

        self.control = ControlDir()
        env.update(self.control.env())  # drain and cancellation (trtspec.triton_repo.control)
        env.update(self.env)
        self._proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=die_with_parent(),
            cwd=self.repo,
            start_new_session=True,  # own process group: we stop it and its stubs
            umask=SERVER_UMASK,
        )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{READY_PATH}", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = Path(self.log_file).read_text(encoding="utf-8", errors="replace")  # type: ignore[arg-type]
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def load_errors(self) -> str:
        """The log's model-load failures (``failed to load`` lines), else its tail; harmless CUDA noise skipped."""
        try:
            assert self.log_file is not None
            lines = Path(self.log_file).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        failed = [
            line.split("] ", 1)[-1].replace("\\n", " ").strip()
            for line in lines
            if line.startswith("E") and ("failed to load" in line or "Failed to create" in line)
        ]
        return "\n".join(failed[:6]) if failed else self.log_tail()

    def wait_ready(self) -> None:
        """Poll /v2/health/ready until the deadline; a server that exits or never gets ready raises ServerError."""
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerError(
                    f"tritonserver exited with code {self._proc.returncode} before it was ready; "
                    f"log {self.log_file}:\n{self.load_errors()}",
                    hint="the log names the model that failed to load and why",
                )
            self.protect_shm()  # the stubs create their regions while the models load
            if self.is_ready():
                self.protect_shm()
                return
            time.sleep(0.25)
        raise ServerError(
            f"tritonserver was not ready within {self.ready_timeout_s:.0f} s; log {self.log_file}:\n"
            f"{self.load_errors()}",
            hint="a model may still be loading: raise the timeout, or read the log",
        )

    def protect_shm(self) -> None:
        """Owner-only modes on this server's Python-backend regions (new stubs make new ones)."""
        protect_shm_regions(self.shm_prefix)

    def drain(self, timeout_s: float, abort: Any = None) -> Any:
        """Stop admitting, let in-flight requests finish for up to ``timeout_s``, then cut the rest with a final error
        (trtspec.serving.lifecycle); ``abort()`` true ends the wait early. The server keeps running: ``stop()`` it."""
        from trtspec.serving.lifecycle import drain

        if self.control is None or self._proc is None:
            raise ServerError("this server is not running", hint="start() it first")
        return drain(self.control, timeout_s, exited=lambda: self.exit_code() is not None or bool(abort and abort()))

    def reload_model(self, model: str, timeout_s: float = 300.0) -> None:
        """Unload and load ``model`` through the repository API (``model_control`` servers): new stubs for it."""
        from trtspec.serving.lifecycle import reload_model

        if not self.model_control:
            raise ServerError("this server runs without model control", hint="start it with model_control=True")
        reload_model(self.http_url, model, self.repository_key, timeout_s)

    def restart(self) -> TritonServer:
        """Stop the server (its stubs with it) and start it again on the same ports."""
        self.stop()
        return self.start()

    def stop(self) -> int | None:
        """SIGINT (Triton waits for what is still in flight), then SIGTERM, then SIGKILL to the whole process group."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        try:
            for sig, wait in ((signal.SIGINT, self.stop_timeout_s), (signal.SIGTERM, 5.0)):
                if proc.poll() is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=wait)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # stubs left in the group, if any
            proc.wait(timeout=10)
        finally:
            if self._log is not None:
                self._log.close()  # type: ignore[attr-defined]
                self._log = None
            if self.control is not None:
                self.control.remove()
                self.control = None
            remove_shm_regions(self.shm_prefix)
        return proc.returncode

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serving(repo: Path, **kwargs: object) -> Iterator[TritonServer]:
    """``with serving(repo) as server:`` -- a started, ready server that is stopped on exit."""
    server = TritonServer(Path(repo), **kwargs)  # type: ignore[arg-type]
    with server:
        yield server
