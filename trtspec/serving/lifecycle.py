"""The server's side of the serving lifecycle: the control directory the models read (trtspec.triton_repo.control),
the drain on SIGTERM / Ctrl-C, and the supervision loop that watches the stubs.

Drain: write ``drain.json`` (the models stop admitting within ``POLL_S`` and cut what still runs at the deadline),
wait until every live model process reports 0 in-flight requests (or the deadline, plus a short grace for the cut
requests' final responses), then stop tritonserver. Triton's own shutdown is what runs after that, with nothing left
to wait for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.procs import pid_alive
from trtspec.triton_repo.control import CONTROL_DIR_ENV, DRAIN_FILE, INFLIGHT_DIR, POLL_S, read_json, write_json

DEFAULT_DRAIN_TIMEOUT_S = 30.0
CUT_GRACE_S = 3.0  # after the deadline: time for the models to send the cut requests' final errors


@dataclass
class DrainResult:
    """How a drain ended: ``finished`` when nothing was left in flight before the deadline."""

    finished: bool
    waited_s: float
    inflight_at_start: int
    cut: int

    def line(self) -> str:
        if self.finished:
            return (
                f"drained in {self.waited_s:.1f} s: {self.inflight_at_start} in-flight request(s) finished, "
                "new ones refused"
            )
        return (
            f"drain deadline reached after {self.waited_s:.1f} s: {self.cut} request(s) still running got a final error"
        )


class ControlDir:
    """The directory shared with the models (``TRTSPEC_CONTROL_DIR``); created fresh per server."""

    def __init__(self, path: Path | None = None) -> None:
        # The models rewrite their reports as their numbers change: keep them in memory (tmpfs) where there is one.
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.path = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="trtspec-control-", dir=shm))
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / INFLIGHT_DIR).mkdir(exist_ok=True)
        self.drain_id: str | None = None

    def env(self) -> dict[str, str]:
        return {CONTROL_DIR_ENV: str(self.path)}

    def start_drain(self, timeout_s: float) -> float:
        """Tell the models to drain; returns the deadline (monotonic clock)."""
        self.drain_id = uuid.uuid4().hex[:12]
        write_json(
            self.path / DRAIN_FILE,
            {"id": self.drain_id, "deadline_unix": time.time() + timeout_s, "timeout_s": timeout_s},
        )
        return time.monotonic() + timeout_s

    def reports(self) -> list[dict[str, Any]]:
        """The live model processes' reports (a dead process's file is removed)."""
        out = []
        for path in sorted((self.path / INFLIGHT_DIR).glob("*.json")):
            data = read_json(path)
            if data is None:
                continue
            if not pid_alive(int(data.get("pid", 0))):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            out.append(data)
        return out

    def inflight(self, field: str = "count") -> int | None:
        """Summed over every live model process: ``count`` (requests in flight), ``clients`` (client requests in
        flight, not the orchestrator's engine requests) or ``cut``; None until each has answered this drain."""
        reports = self.reports()
        if any(r.get("drain") != self.drain_id for r in reports):
            return None
        return sum(int(r.get(field) or 0) for r in reports)

    def report_of(self, model: str, pid: int) -> dict[str, Any] | None:
        """The last report of one model process (alive or not)."""
        return read_json(self.path / INFLIGHT_DIR / f"{model}.{pid}.json")

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def drain(
    control: ControlDir, timeout_s: float, *, exited: Callable[[], bool] = lambda: False, poll_s: float = POLL_S
) -> DrainResult:
    """Drain the models through ``control``: returns when nothing is in flight, or after the deadline's cut (the
    models cut by their own clock: then a grace for the final errors to leave)."""
    start = time.monotonic()
    end = control.start_drain(timeout_s) + CUT_GRACE_S
    first: int | None = None
    while not exited() and time.monotonic() < end:
        n = control.inflight()
        if n is not None:
            if first is None:
                first = control.inflight("clients") or 0
            if n == 0:
                break
        time.sleep(poll_s)
    cut = control.inflight("cut") or 0
    return DrainResult(control.inflight() == 0 and cut == 0, time.monotonic() - start, first or 0, cut)


# -- the stub watch and its recovery -------------------------------------------------------------------------------
REPOSITORY_KEY_HEADER = "trtspec-repository-key"


# Triton 2.51's control APIs that no client needs to generate (its --http-restricted-api / --grpc-restricted-protocol
# allow health, metadata, inference, shared-memory, model-config, model-repository, statistics, trace, logging):
# loading/unloading models, registering shared memory (a stub's region included), trace settings (which name a file
# the server writes) and log settings. Health, metadata, inference, model-config and statistics stay open: clients
# (perf_analyzer, genai-perf, tritonclient) read them.
RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")


def restricted_api_args(key: str) -> list[str]:
    """tritonserver flags that put every control API (RESTRICTED_APIS) behind ``key``, on HTTP and gRPC."""
    apis = ",".join(RESTRICTED_APIS)
    return [
        f"--http-restricted-api={apis}:{REPOSITORY_KEY_HEADER}={key}",
        f"--grpc-restricted-protocol={apis}:{REPOSITORY_KEY_HEADER}={key}",
    ]


def model_control_args(key: str) -> list[str]:
    """tritonserver flags for explicit model control whose repository API (and every other control API) needs
    ``key`` (nobody else unloads)."""
    return ["--model-control-mode=explicit", "--load-model=*", *restricted_api_args(key)]


def _post(url: str, key: str, timeout_s: float) -> None:
    import urllib.error
    import urllib.request

    from trtspec.errors import ServerError

    req = urllib.request.Request(url, data=b"{}", method="POST", headers={REPOSITORY_KEY_HEADER: key})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s):
            return
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", errors="replace")[:300]
        raise ServerError(f"{url}: HTTP {exc.code} {body}", hint="the server log says why") from None
    except OSError as exc:
        raise ServerError(f"{url}: {exc}", hint="is the server running?") from None


def reload_model(http_url: str, model: str, key: str, timeout_s: float = 300.0) -> None:
    """Unload then load ``model``: on Triton 2.51 a plain load of an unchanged model is a no-op that leaves a dead
    stub dead (measured); unload + load starts new stubs."""
    base = f"http://{http_url}/v2/repository/models/{model}"
    _post(f"{base}/unload", key, timeout_s)
    _post(f"{base}/load", key, timeout_s)


def dead_stub_line(stub: Any) -> str:
    return (
        f"model stub {stub.instance} (model {stub.model}, pid {stub.pid}) {stub.how}: the server is not ready "
        "until it is replaced"
    )


def supervise(
    server: Any,
    stop: Any,
    say: Callable[[str], None],
    *,
    watch: bool = True,
    poll_s: float = 1.0,
    reload_timeout_s: float = 300.0,
    check: Callable[[], None] | None = None,
    started: Callable[[], None] | None = None,
) -> None:
    """Until ``stop`` (a threading.Event) is set: raise ServerError when tritonserver exits; with ``watch``, notice
    a dead stub (one line), and replace it: reload its model, or restart the server when that fails. ``check`` runs
    every poll (e.g. the OpenAI frontend's: it raises when the frontend died); ``started`` once the watch has its
    baseline (say "ready" there: a stub killed right after is then seen dying, with how)."""
    from trtspec.errors import ServerError
    from trtspec.serving.stubs import StubWatch, expected_stubs

    stubs = StubWatch(server.pid, expected_stubs(server.repo)) if watch else None
    if started is not None:
        started()
    while True:
        if stubs is not None:  # first pass at once: a stub that died before the watch began is missing, not dead
            _watch_once(server, stubs, say, reload_timeout_s)
        if stop.wait(poll_s):
            return
        code = server.exit_code()
        if code is not None:
            raise ServerError(
                f"tritonserver exited with code {code}; log {server.log_file}:\n{server.log_tail()}",
                hint="the log says why",
            )
        protect = getattr(server, "protect_shm", None)
        if protect is not None:  # regions of stubs started since (a reload): owner-only
            protect()
        if check is not None:
            check()


def _watch_once(server: Any, stubs: Any, say: Callable[[str], None], reload_timeout_s: float) -> None:
    """One look at the stubs: report the dead and the missing, and replace their models."""
    if server.exit_code() is not None:
        return  # the caller reports that
    dead = stubs.check()
    missing = {} if dead else stubs.missing()  # e.g. died (and reaped) before the first look
    if not dead and not missing:
        return
    for stub in dead:
        say(dead_stub_line(stub))
        report = server.control.report_of(stub.model, stub.pid) if server.control is not None else None
        if report and report.get("clients"):
            say(
                f"{report['clients']} request(s) in flight on it will get no response (Triton 2.51 cannot "
                "fail them: clients need a timeout)"
            )
    for model, n in missing.items():
        say(
            f"model {model}: {n} of its {stubs.expected[model]} stub(s) not running: the server is not ready "
            "until it is replaced"
        )
    _replace(server, sorted({s.model for s in dead} | set(missing)), say, reload_timeout_s)
    stubs.reset(server.pid)


def _replace(server: Any, models: list[str], say: Callable[[str], None], timeout_s: float) -> None:
    from trtspec.errors import ServerError

    t0 = time.monotonic()
    if getattr(server, "model_control", False):
        try:
            for model in models:
                server.reload_model(model, timeout_s)
            server.wait_ready()
            say(f"reloaded {', '.join(models)} in {time.monotonic() - t0:.1f} s: ready again")
            return
        except ServerError as exc:
            say(f"reloading {', '.join(models)} failed ({exc.message.splitlines()[0]}): restarting the server")
    server.restart()
    say(f"restarted the server in {time.monotonic() - t0:.1f} s: ready again")
