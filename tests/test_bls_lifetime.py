"""The BLS iterator lifetime rule, on a model of the Python backend stub's threads (python_backend r24.10).

The model keeps what matters of src/pb_stub.cc: a map holding a reference to every live response iterator, and one
stub-to-parent thread that serves a FIFO queue of messages: a cleanup erases an iterator from the map (without the
GIL in the real stub), an is-cancelled query answers its caller. The real bug is an iterator *destroyed* by that
erase; here each iterator records the thread that destroyed it. The real stub is exercised by the stress test in
tests/test_serving_stress.py; this test shows the rule deterministically, with the stub thread running late.
"""

from __future__ import annotations

import queue
import threading
import time

from trtspec.triton_repo.bls_lifetime import IteratorJanitor

STUB_THREAD = "stub-to-parent"


class FakeStub:
    def __init__(self, delay_s: float) -> None:
        self.map: dict[int, object] = {}
        self.lock = threading.Lock()
        self.messages: queue.Queue = queue.Queue()
        self.delay_s = delay_s
        self.destroyed_on: list[str] = []
        self.thread = threading.Thread(target=self._serve, name=STUB_THREAD, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            kind, payload = self.messages.get()
            time.sleep(self.delay_s)  # the parent's acknowledgement of the previous message, a busy CPU ...
            if kind == "cleanup":
                with self.lock:
                    self.map.pop(payload, None)  # the map's reference goes: the last one, or not
            elif kind == "is_cancelled":
                payload.set()
            elif kind == "stop":
                return

    def new_iterator(self, n_responses: int) -> FakeIterator:
        it = FakeIterator(self, n_responses)
        with self.lock:
            self.map[id(it)] = it
        return it


class FakeIterator:
    """A decoupled BLS response iterator: the last ``next()`` queues its cleanup (ResponseIterator::Clear)."""

    def __init__(self, stub: FakeStub, n: int) -> None:
        self.stub, self.left = stub, n

    def __iter__(self) -> FakeIterator:
        return self

    def __next__(self) -> int:
        if self.left == 0:
            raise StopIteration
        self.left -= 1
        if self.left == 0:
            self.stub.messages.put(("cleanup", id(self)))
        return self.left

    def __del__(self) -> None:
        self.stub.destroyed_on.append(threading.current_thread().name)


class FakeRequest:
    """The request being served: ``is_cancelled()`` waits for its answer through the same queue."""

    def __init__(self, stub: FakeStub) -> None:
        self.stub = stub

    def is_cancelled(self) -> bool:
        done = threading.Event()
        self.stub.messages.put(("is_cancelled", done))
        done.wait()
        return False


def _poll(request: FakeRequest, lock: threading.Lock):
    """What trtspec.triton_repo.control.Tracked.poll_cancelled does for an open request: one serialized round trip."""

    def poll() -> bool:
        with lock:
            return request.is_cancelled()

    return poll


def _serve_requests(stub: FakeStub, janitor: IteratorJanitor | None, n_threads: int = 4, calls: int = 25) -> None:
    def worker() -> None:
        request, lock = FakeRequest(stub), threading.Lock()
        for _ in range(calls):
            it = stub.new_iterator(3)
            for _response in it:
                pass
            if janitor is not None:
                janitor.retire(it)
                del it
                janitor.barrier(_poll(request, lock))
            else:
                del it  # what the orchestrator did before: Python's reference goes right away

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_without_the_rule_the_stub_thread_destroys_iterators():
    stub = FakeStub(delay_s=0.002)
    _serve_requests(stub, None, calls=10)
    time.sleep(0.5)
    assert STUB_THREAD in stub.destroyed_on  # the crash of the real stub, in this model


def test_with_the_janitor_no_iterator_is_destroyed_by_the_stub_thread():
    stub = FakeStub(delay_s=0.002)
    janitor = IteratorJanitor()
    _serve_requests(stub, janitor)
    time.sleep(0.5)
    assert len(stub.destroyed_on) == janitor.released == 100 - janitor.parked
    assert STUB_THREAD not in stub.destroyed_on
    assert not stub.map  # every iterator was erased by the stub before Python let it go


def test_a_cancelled_request_proves_nothing_and_its_iterators_wait_for_a_later_barrier():
    stub = FakeStub(delay_s=0.01)
    janitor = IteratorJanitor()

    class Cancelled(FakeRequest):
        def is_cancelled(self) -> bool:
            return True  # answered from the cache, nothing queued

    it = stub.new_iterator(1)
    janitor.retire(it)
    del it
    assert janitor.barrier(_poll(Cancelled(stub), threading.Lock())) is True
    assert janitor.parked == 1 and not stub.destroyed_on
    assert janitor.barrier(lambda: None) is True  # a closed request is not asked: nothing proven either
    assert janitor.parked == 1 and not stub.destroyed_on
    assert janitor.barrier(_poll(FakeRequest(stub), threading.Lock())) is False
    assert janitor.parked == 0 and stub.destroyed_on == ["MainThread"]
