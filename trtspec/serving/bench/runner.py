"""Load: fixed concurrency (closed loop: each client sends its next request when the last one ends) or a request
rate (open loop: Poisson arrivals, whatever the server's pace), and the figures of one run."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from trtspec.serving.bench.clients import Record
from trtspec.serving.bench.workload import Item

Send = Callable[[Item], Record]
PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


def closed_loop(send: Send, items: list[Item], concurrency: int, n_requests: int) -> tuple[list[Record], float]:
    """``n_requests`` items (cycled) from ``concurrency`` clients; (records, wall seconds)."""
    lock = threading.Lock()
    next_index = [0]
    records: list[Record] = []

    def worker() -> None:
        while True:
            with lock:
                i = next_index[0]
                if i >= n_requests:
                    return
                next_index[0] += 1
            r = send(items[i % len(items)])
            with lock:
                records.append(r)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, time.perf_counter() - t0


def open_loop(send: Send, items: list[Item], rate: float, n_requests: int, seed: int = 0) -> tuple[list[Record], float]:
    """``n_requests`` items (cycled) arriving as a Poisson process of ``rate`` per second; (records, wall seconds
    from the first arrival to the last completion)."""
    rng = random.Random(seed)
    lock = threading.Lock()
    records: list[Record] = []
    threads = []

    def one(item: Item) -> None:
        r = send(item)
        with lock:
            records.append(r)

    t0 = time.perf_counter()
    due = 0.0
    for i in range(n_requests):
        delay = t0 + due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t = threading.Thread(target=one, args=(items[i % len(items)],), daemon=True)
        t.start()
        threads.append(t)
        due += rng.expovariate(rate)
    for t in threads:
        t.join()
    return records, time.perf_counter() - t0


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of ``values``; None for none."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def summarize(records: list[Record], wall: float) -> dict[str, Any]:
    """One run's figures: throughput, TTFT / ITL / end-to-end percentiles, acceptance over speculative requests."""
    ok = [r for r in records if r.error is None]
    errors = [r.error for r in records if r.error is not None]
    tokens = sum(r.tokens for r in ok)
    spec = [r for r in ok if not r.routed]
    known = [r for r in spec if r.has_acceptance]
    drafted = sum(r.drafted for r in known)
    out: dict[str, Any] = {
        "requests": len(ok),
        "errors": len(errors),
        "routed_to_target": len(ok) - len(spec),
        "wall_s": round(wall, 3),
        "output_tokens": tokens,
        "output_tok_per_s": round(tokens / wall, 2) if wall else 0.0,
        "requests_per_s": round(len(ok) / wall, 3) if wall else 0.0,
        "mean_concurrency": round(sum(r.latency for r in ok) / wall, 2) if wall else 0.0,
        "input_tokens_mean": round(statistics.fmean([r.input_tokens for r in ok]), 1) if ok else None,
        "output_tokens_mean": round(tokens / len(ok), 1) if ok else None,
        # None: no request reported draft statistics (unavailable, e.g. the LLM API's zeroed perf metrics)
        "acceptance_rate": (round(sum(r.accepted for r in known) / drafted, 4) if drafted else 0.0) if known else None,
        "first_error": errors[0] if errors else None,
    }
    for name, values in (
        ("ttft", [r.ttft for r in ok if r.ttft is not None]),
        ("itl", [r.itl for r in ok if r.itl is not None]),
        ("e2e", [r.latency for r in ok]),
    ):
        for label, q in PERCENTILES:
            out[f"{name}_{label}_s"] = pct(values, q)
    return out
