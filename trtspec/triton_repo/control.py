"""The serving lifecycle inside the repository's Python models: drain, cancellation, in-flight bookkeeping.

``trtspec serve`` (trtspec.serving.lifecycle) and the models share a control directory, named by
``TRTSPEC_CONTROL_DIR`` in tritonserver's environment (the Python stubs inherit it):

- ``drain.json`` -- written by the server when it starts draining: ``{"id", "deadline_unix", "timeout_s"}``. From then
  on every model refuses new requests with one UNAVAILABLE error (requests the orchestrator sends to the engines for
  requests already admitted carry ``INTERNAL_PARAMETERS`` and are still served), and at the deadline sends a final
  error to each request still running: a client never sees a stream end without a final response.
- ``inflight/<model>.<pid>.json`` -- written by each model process when its numbers change (at most once a poll):
  ``{"count": n, "clients": c, "cut": k, "drain": id}``: ``count`` every tracked request, ``clients`` without the
  orchestrator's engine requests, ``cut`` client requests cut at the deadline, ``drain`` the drain it answers (null
  before one). The server also reads it to say how many requests a dead stub took with it. The server stops
  tritonserver once every live model process reports 0 for its drain.

Why not Triton's own shutdown (measured on Triton 2.51, trtspec.serving.lifecycle has the figures): on SIGTERM it
waits for in-flight requests up to ``--exit-timeout-secs``, then does not exit and sends nothing to the cut streams.

Cancellation: one watcher thread per model process asks ``request.is_cancelled()`` of each admitted client request
every ``POLL_S`` (one IPC round trip per active request per poll, none per decoding step). A cancelled request gets a
final CANCELLED response (Triton needs the final flag to release the request) and its ``on_cancel`` callback runs,
so the model stops its generation and frees its KV slot.

Every response goes through ``Tracked.send``: under one per-request lock, so the watcher never polls a request whose
final response has gone (its response factory is gone on the server side), and a response due after the request was
closed (cancelled, or cut at the deadline) is dropped instead of raising in the engine thread. Code that needs its
own ``is_cancelled()`` round trip (the orchestrator's BLS-iterator barrier) calls ``Tracked.poll_cancelled()``:
serialized with the watcher's polls, so each call queues its own message.

No Triton import here: the model passes its ``triton_python_backend_utils`` module in, requests are duck-typed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONTROL_DIR_ENV = "TRTSPEC_CONTROL_DIR"
DRAIN_FILE = "drain.json"
INFLIGHT_DIR = "inflight"
INTERNAL_PARAMETER = "trtspec_internal"
# Parameters of the requests the orchestrator sends to the engine models on behalf of an admitted request.
INTERNAL_PARAMETERS = {INTERNAL_PARAMETER: True}
POLL_S = 0.1
INTERNAL_CUT_GRACE_S = 1.0  # after the drain deadline: engine requests the orchestrator did not stop
FINAL_FLAG = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL

REFUSED = (
    "the server is shutting down and admits no new requests (hint: retry; another replica, or this one "
    "after its restart, serves it)"
)
CUT = (
    "the server shut down before this request finished: the drain deadline ({timeout:g} s) passed (hint: retry "
    "the request; raise --drain-timeout for longer generations)"
)
CANCELLED = "the request was cancelled by the client"

log = logging.getLogger("trtspec.control")


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a reader sees the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def is_internal(request: Any) -> bool:
    """Whether ``request`` was sent by the orchestrator for an already admitted request."""
    try:
        return bool(json.loads(request.parameters() or "{}").get(INTERNAL_PARAMETER))
    except (AttributeError, ValueError, TypeError):
        return False


class Tracked:
    """One admitted request: its response sender behind a lock; closed by the first final response."""

    def __init__(self, control: ModelControl, request: Any, sender: Any, internal: bool) -> None:
        self._control = control
        self.request = request
        self._sender = sender  # None: a non-decoupled request
        self.internal = internal
        self.lock = threading.Lock()
        self.closed = False
        self.cancelled = False  # by the client, or cut at the drain deadline: stop generating
        self._on_cancel: Callable[[], Any] | None = None
        self.response: Any = None  # non-decoupled: the one response, for execute() to return

    @property
    def on_cancel(self) -> Callable[[], Any] | None:
        """Called once (on the watcher thread) when the request is cancelled or cut: stop its generation. Set after
        the request was already cancelled, it runs at once."""
        return self._on_cancel

    @on_cancel.setter
    def on_cancel(self, callback: Callable[[], Any] | None) -> None:
        with self.lock:
            self._on_cancel = callback
            run_now = self.cancelled
        if run_now and callback is not None:
            callback()

    def send(self, response: Any = None, flags: int = 0) -> bool:
        """``InferenceResponseSender.send``, or nothing (False) once the request is closed. A non-decoupled request
        keeps its response in ``response`` instead, for the model to return from ``execute``."""
        with self.lock:
            if self.closed:
                return False
            if flags & FINAL_FLAG:
                self.closed = True
                self._control._forget(self)
            if self._sender is None:
                self.response = response
            else:
                self._sender.send(response, flags=flags)
        return True

    def poll_cancelled(self) -> bool | None:
        """One ``request.is_cancelled()`` round trip of its own; None (no round trip) once the request is closed."""
        with self.lock:
            if self.closed:
                return None
            return bool(self.request.is_cancelled())

    def close_with_error(self, message: str, code: Any) -> bool:
        """Stop the request: a final error response (unless a final response was sent), then ``on_cancel``. True
        when this call closed it (False: it was closed already)."""
        pb = self._control.pb_utils
        try:
            closed_here = self.send(pb.InferenceResponse(error=pb.TritonError(message, code)), flags=FINAL_FLAG)
        except Exception:  # noqa: BLE001 - a client that is gone cannot be told; send had closed the request
            closed_here = True
        with self.lock:
            self.cancelled = True
            callback = self._on_cancel
        self._control._forget(self)
        if callback is not None:
            try:
                callback()
            except Exception:  # noqa: BLE001 - the watcher keeps watching the others
                log.exception("%s: on_cancel failed", self._control.name)
        return closed_here


class ModelControl:
    """Drain and cancellation for one model process (see module docstring). One per model instance."""

    def __init__(
        self, pb_utils: Any, name: str, *, directory: str | Path | None = None, poll_s: float = POLL_S
    ) -> None:
        self.pb_utils = pb_utils
        self.name = name
        found = os.environ.get(CONTROL_DIR_ENV) if directory is None else directory
        self.directory = Path(found) if found else None
        self.poll_s = poll_s
        self._tracked: dict[int, Tracked] = {}
        self._lock = threading.Lock()
        self._drain: dict[str, Any] | None = None
        self._reported: tuple[Any, ...] | None = None
        self.cut = 0  # client requests cut at the drain deadline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.directory is not None:
            self._report()
        self._thread = threading.Thread(target=self._watch, name=f"trtspec-control-{name}", daemon=True)
        self._thread.start()

    # -- what the model calls ------------------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._drain is not None

    def admit(self, request: Any, decoupled: bool = True) -> Tracked:
        """Track a request: its ``send`` replaces the response sender's (see ``Tracked.send`` for non-decoupled
        models). While draining, a client's request comes back closed: refused, with its error response sent (or,
        non-decoupled, in ``response``)."""
        internal = is_internal(request)
        tracked = Tracked(self, request, request.get_response_sender() if decoupled else None, internal)
        if self._drain is not None and not internal:
            with contextlib.suppress(Exception):
                tracked.send(self.refusal(), flags=FINAL_FLAG)
            tracked.closed = True
            return tracked
        with self._lock:
            self._tracked[id(tracked)] = tracked
        return tracked

    def refusal(self) -> Any:
        """The error response for a request refused while draining (UNAVAILABLE: a load balancer retries it)."""
        pb = self.pb_utils
        return pb.InferenceResponse(error=pb.TritonError(REFUSED, pb.TritonError.UNAVAILABLE))

    def close(self) -> None:
        """Stop the watcher (the model's ``finalize``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.directory is not None:
            with contextlib.suppress(OSError):
                self._inflight_path().unlink()

    @property
    def inflight(self) -> int:
        return len(self._tracked)

    # -- the watcher ---------------------------------------------------------------------------------------------
    def _forget(self, tracked: Tracked) -> None:
        with self._lock:
            self._tracked.pop(id(tracked), None)

    def _read_drain(self) -> dict[str, Any] | None:
        if self.directory is None:
            return None
        return read_json(self.directory / DRAIN_FILE)

    def _inflight_path(self) -> Path:
        assert self.directory is not None
        return self.directory / INFLIGHT_DIR / f"{self.name}.{os.getpid()}.json"

    def _report(self) -> None:
        drain_id = None if self._drain is None else self._drain.get("id")
        with self._lock:
            count = len(self._tracked)
            clients = sum(1 for t in self._tracked.values() if not t.internal)
        state = (drain_id, count, clients, self.cut)
        if self._reported == state or self.directory is None:
            return
        try:
            write_json(
                self._inflight_path(),
                {
                    "model": self.name,
                    "pid": os.getpid(),
                    "drain": drain_id,
                    "count": count,
                    "clients": clients,
                    "cut": self.cut,
                },
            )
            self._reported = state
        except OSError:
            log.exception("%s: cannot report to %s", self.name, self.directory)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - the watcher must outlive one bad poll
                log.exception("%s: control watcher", self.name)

    def _lateness(self) -> float | None:
        """Seconds past the drain deadline (negative before it); None while not draining. Reads the drain file
        itself when this process's watcher has not yet: a caller must not wait for the next poll to know."""
        if self._drain is None:
            self._drain = self._read_drain()
        if self._drain is None:
            return None
        return time.time() - float(self._drain.get("deadline_unix", 0))

    def cut_at_deadline(self, tracked: Tracked) -> bool:
        """Cut ``tracked`` with the drain's final error if the deadline has passed (True; already closed: nothing is
        sent or counted), counting a client's cut.

        The watcher calls it at the deadline; the orchestrator calls it when a request of its fails, because the
        failure after the deadline is an engine's cut of the request's engine call: it is this request's cut, not
        an ordinary error, whichever watcher ticked first."""
        late = self._lateness()
        if late is None or late < 0:
            return False
        assert self._drain is not None
        message = CUT.format(timeout=float(self._drain.get("timeout_s", 0)))
        if tracked.close_with_error(message, self.pb_utils.TritonError.UNAVAILABLE) and not tracked.internal:
            self.cut += 1  # counted once: by whichever of the watcher and the orchestrator closed it
        return True

    def _tick(self) -> None:
        late = self._lateness()
        with self._lock:
            active = list(self._tracked.values())
        if late is not None and late >= 0:
            # Each model cuts the clients it admitted; the orchestrator's engine requests only after a grace, as a
            # backstop for an orchestrator that does not stop them (it stops them when it cuts its client).
            keep = []
            for t in active:
                if t.internal and late < INTERNAL_CUT_GRACE_S:
                    keep.append(t)
                else:
                    self.cut_at_deadline(t)
            active = keep
        for t in active:
            if t.internal or t.cancelled:
                continue  # the orchestrator's engine requests cannot be cancelled by a client
            if t.poll_cancelled():
                t.close_with_error(CANCELLED, self.pb_utils.TritonError.CANCELLED)
        self._report()
