"""Keep every BLS response iterator alive until the Python backend stub has forgotten it.

Why (python_backend r24.10, the stub in Triton 2.51; read in src/pb_stub.cc, src/pb_response_iterator.cc,
src/pb_tensor.cc): a decoupled BLS call returns a ``ResponseIterator`` that the stub also keeps in its
``response_iterator_map_`` (a ``shared_ptr``). When ``next()`` hands Python the final response,
``ResponseIterator::Clear()`` queues a cleanup message; the stub's stub-to-parent thread later runs ``SendCleanupId``,
which erases the map's entry **without holding the GIL**. If Python has already dropped its own reference by then, that
erase destroys the iterator, its responses and their tensors, and every tensor owns a numpy array
(``PbTensor::numpy_array_``): numpy objects are freed without the GIL and the interpreter's heap is corrupted. The stub
dies later, somewhere else (SIGSEGV in ``pymalloc_alloc``). Measured here: concurrent streamed requests lost an
orchestrator stub after a few hundred requests; Triton does not restart it. From r24.12 the stub takes the GIL in
the tensor destructor while ``SendCleanupId`` holds the map's mutex, and ``GetResponseIterator`` takes that mutex with
the GIL held: the same ordering becomes a deadlock instead of a crash.

The rule that removes both: Python's last reference to an iterator is dropped only after the stub has erased the
iterator from its map, so the erase never destroys anything and the destruction happens in Python, under the GIL.

How we know the erase is done: ``request.is_cancelled()`` on the request being served queues an
``IsRequestCancelled`` message to the same stub-to-parent thread and waits for its answer. The queue is FIFO, so when
the call returns, every cleanup queued before it has been processed. A finished iterator is therefore *parked*
(strong reference kept) with a sequence number, and released by the first barrier that started after it was parked.
Two caveats, both handled: concurrent ``is_cancelled()`` calls on one request share one in-flight message (so
barriers on one request are serialized by a per-request lock), and a cancelled request answers from a cache without
queueing anything (so its barrier releases nothing; its iterators wait for a later barrier of another request).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any


class IteratorJanitor:
    """Parks finished BLS response iterators; ``barrier()`` releases those whose cleanup the stub has processed.

    One per model instance (the stub's map is per process); thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parked: list[tuple[int, Any]] = []
        self._seq = itertools.count()
        self.released = 0

    @property
    def parked(self) -> int:
        return len(self._parked)

    def retire(self, iterator: Iterator[Any]) -> None:
        """Finish ``iterator`` (so that its cleanup is queued) and park it. Blocks while responses are still due."""
        for _ in iterator:  # an iterator left early (an error response, an exception) still owes its final response
            pass
        with self._lock:
            self._parked.append((next(self._seq), iterator))

    def barrier(self, request: Any, request_lock: threading.Lock) -> bool:
        """Wait until the stub has processed every cleanup queued so far (see module docstring), then release the
        iterators parked before this call. Blocks (run it off the event loop). Returns whether ``request`` has been
        cancelled (its client went away): the answer the barrier gets for free."""
        with request_lock:
            with self._lock:
                mark = next(self._seq)
            cancelled = bool(request.is_cancelled())
        if cancelled:  # answered from a cache: nothing was queued, so nothing is proven
            return True
        with self._lock:
            done = [it for seq, it in self._parked if seq < mark]
            self._parked = [(seq, it) for seq, it in self._parked if seq >= mark]
        self.released += len(done)
        del done  # the iterators are destroyed here: in Python, with the GIL held
        return False
