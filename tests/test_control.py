"""The drain / cancellation protocol between `trtspec serve` and the Python models, without a server: the model side
(trtspec.triton_repo.control) against stand-ins for the three python_backend objects it touches (request, response
sender, ``triton_python_backend_utils``), with the r24.10 semantics it relies on; the server side (lifecycle)
for real. The end-to-end behaviour on a real tritonserver is in test_drain.py and test_cancel.py."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from trtspec.serving.lifecycle import ControlDir, drain
from trtspec.triton_repo.control import (
    CANCELLED,
    FINAL_FLAG,
    INTERNAL_CUT_GRACE_S,
    INTERNAL_PARAMETERS,
    REFUSED,
    ModelControl,
    is_internal,
)


class FakePbUtils:
    """Stand-in for triton_python_backend_utils: the error codes and the two constructors control.py uses."""

    class TritonError:
        UNAVAILABLE, CANCELLED = "UNAVAILABLE", "CANCELLED"

        def __init__(self, message, code="INTERNAL"):
            self.msg, self.code_ = message, code

    class InferenceResponse:
        def __init__(self, output_tensors=(), error=None):
            self.output_tensors, self.error = output_tensors, error


class FakeSender:
    """Like r24.10's ResponseSender: raises on a send after the final one."""

    def __init__(self):
        self.sent: list[tuple[object, int]] = []
        self.closed = False

    def send(self, response=None, flags=0):
        if self.closed:
            raise RuntimeError("Unable to send response. Response sender has been closed.")
        self.sent.append((response, flags))
        self.closed = bool(flags & FINAL_FLAG)


class FakeRequest:
    def __init__(self, parameters=None, cancelled=False):
        self.sender = FakeSender()
        self._parameters = json.dumps(parameters or {})
        self.cancelled = cancelled
        self.polls = 0

    def get_response_sender(self):
        return self.sender

    def parameters(self):
        return self._parameters

    def is_cancelled(self):
        assert not self.sender.closed, "is_cancelled() after the final response (its factory is gone)"
        self.polls += 1
        return self.cancelled


def _wait(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def control_dir(tmp_path):
    return ControlDir(tmp_path / "control")


@pytest.fixture
def model(control_dir):
    m = ModelControl(FakePbUtils, "tensorrt_llm", directory=control_dir.path, poll_s=0.02)
    yield m
    m.close()


def test_responses_after_the_final_one_are_dropped_not_raised(model):
    req = FakeRequest()
    t = model.admit(req)
    assert t.send("a") and t.send("b", flags=FINAL_FLAG)
    assert not t.send("late") and not t.send("late final", flags=FINAL_FLAG)
    assert [r for r, _ in req.sender.sent] == ["a", "b"] and model.inflight == 0
    assert t.poll_cancelled() is None  # closed: no round trip


def test_a_cancelled_request_gets_a_final_cancelled_response_and_its_callback(model):
    req = FakeRequest()
    t = model.admit(req)
    stopped = threading.Event()
    t.on_cancel = stopped.set
    req.cancelled = True
    assert stopped.wait(5)
    ((resp, flags),) = req.sender.sent
    assert flags == FINAL_FLAG and resp.error.code_ == "CANCELLED" and resp.error.msg == CANCELLED
    assert t.cancelled and t.closed and model.inflight == 0
    assert not t.send("token")  # the engine's next tokens go nowhere


def test_internal_requests_are_not_polled_for_cancellation(model):
    req = FakeRequest(parameters=INTERNAL_PARAMETERS)
    assert is_internal(req) and not is_internal(FakeRequest())
    model.admit(req)
    time.sleep(0.2)
    assert req.polls == 0


def test_drain_refuses_clients_serves_the_orchestrator_and_reports_in_flight(model, control_dir):
    running = model.admit(FakeRequest())
    control_dir.start_drain(timeout_s=30)
    assert _wait(lambda: model.draining)
    refused = FakeRequest()
    t = model.admit(refused)
    assert t.closed
    ((resp, flags),) = refused.sender.sent
    assert flags == FINAL_FLAG and resp.error.code_ == "UNAVAILABLE" and resp.error.msg == REFUSED
    assert not model.admit(FakeRequest(parameters=INTERNAL_PARAMETERS)).closed
    assert _wait(lambda: control_dir.inflight() == 2)
    running.send("done", flags=FINAL_FLAG)
    assert _wait(lambda: control_dir.inflight() == 1)


def test_the_deadline_cuts_running_requests_with_a_final_error(control_dir):
    model = ModelControl(FakePbUtils, "tensorrt_llm_bls", directory=control_dir.path, poll_s=0.02)
    try:
        req = FakeRequest()
        t = model.admit(req)
        stopped = threading.Event()
        t.on_cancel = stopped.set
        t.send("token")
        result = drain(control_dir, timeout_s=0.3, poll_s=0.02)
        assert not result.finished and result.cut == 1 and result.inflight_at_start == 1
        assert stopped.is_set()
        resp, flags = req.sender.sent[-1]
        assert flags == FINAL_FLAG and resp.error.code_ == "UNAVAILABLE" and "drain deadline" in resp.error.msg
    finally:
        model.close()


def test_at_the_deadline_clients_are_cut_first_and_engine_requests_only_after_a_grace(control_dir):
    # Cut first, an engine request's error would reach the client through the orchestrator as a plain failure and
    # the drain would count no cut request (CI, --drain-timeout 0).
    model = ModelControl(FakePbUtils, "tensorrt_llm", directory=control_dir.path, poll_s=0.02)
    try:
        client, engine = FakeRequest(), FakeRequest(parameters=INTERNAL_PARAMETERS)
        model.admit(client)
        model.admit(engine)
        control_dir.start_drain(timeout_s=0)
        assert _wait(lambda: client.sender.closed)
        assert not engine.sender.closed and model.cut == 1  # inside the grace
        assert _wait(lambda: engine.sender.closed, timeout=INTERNAL_CUT_GRACE_S + 5)
        resp, flags = engine.sender.sent[-1]
        assert flags == FINAL_FLAG and "drain deadline" in resp.error.msg and model.cut == 1
    finally:
        model.close()


def test_a_failure_after_the_deadline_is_the_request_s_cut_even_before_the_watcher_polls(control_dir):
    # What the orchestrator does when an engine call fails: past the deadline that failure is the engines' cut.
    model = ModelControl(FakePbUtils, "tensorrt_llm_bls", directory=control_dir.path, poll_s=3600)
    try:
        req = FakeRequest()
        t = model.admit(req)
        assert not model.cut_at_deadline(t) and not req.sender.sent  # not draining: an ordinary failure
        control_dir.start_drain(timeout_s=0)
        assert model.cut_at_deadline(t) and model.cut == 1
        assert model.cut_at_deadline(t) and model.cut == 1  # the watcher's cut after the orchestrator's: once
        ((resp, flags),) = req.sender.sent
        assert flags == FINAL_FLAG and "drain deadline (0 s) passed" in resp.error.msg
    finally:
        model.close()


def test_drain_finishes_as_soon_as_nothing_is_in_flight(model, control_dir):
    t = model.admit(FakeRequest())
    threading.Timer(0.4, lambda: t.send("last", flags=FINAL_FLAG)).start()
    result = drain(control_dir, timeout_s=30, poll_s=0.02)
    assert result.finished and result.inflight_at_start == 1 and result.waited_s < 10


def test_the_server_ignores_reports_of_dead_model_processes(control_dir):
    (control_dir.path / "inflight" / "gone.999999.json").write_text(
        json.dumps({"model": "gone", "pid": 2**22 + 12345, "count": 3, "drain": None})
    )
    (control_dir.path / "inflight" / f"live.{os.getpid()}.json").write_text(
        json.dumps({"model": "live", "pid": os.getpid(), "count": None, "drain": None})
    )
    control_dir.start_drain(5)
    assert control_dir.inflight() is None  # the live one has not answered this drain yet
    assert [r["model"] for r in control_dir.reports()] == ["live"]


def test_a_callback_set_after_the_cancellation_runs_at_once(model):
    req = FakeRequest(cancelled=True)
    t = model.admit(req)
    assert _wait(lambda: t.cancelled)
    ran = []
    t.on_cancel = lambda: ran.append(True)
    assert ran == [True]


# -- the responder: responses sent off the engine thread (trtspec.triton_repo.responder) ------------------------------


def test_responder_sends_in_posted_order_off_the_posting_thread_and_flushes_on_close():
    from trtspec.triton_repo.responder import Responder

    sent: list[tuple[int, str]] = []
    gate = threading.Event()
    responder = Responder("m")
    responder.post(gate.wait)  # the first send blocks (an IPC round trip): posting must not wait for it
    for i in range(50):
        responder.post(lambda i=i: sent.append((i, threading.current_thread().name)))
    assert sent == []  # nothing overtook the blocked send, and the posting thread was not held
    gate.set()
    responder.close()
    assert [i for i, _ in sent] == list(range(50))
    assert {name for _, name in sent} == {"m-responder"}


def test_responder_reports_a_failed_send_to_its_request_and_goes_on():
    from trtspec.triton_repo.responder import Responder

    failed: list[str] = []
    sent: list[int] = []
    responder = Responder("m")

    def broken() -> None:
        raise RuntimeError("response too large")

    responder.post(broken, lambda exc: failed.append(str(exc)))
    responder.post(broken)  # no handler: logged, the thread lives on
    responder.post(lambda: sent.append(1))
    responder.close()
    assert failed == ["response too large"]
    assert sent == [1]
