"""A small Prometheus registry for trtspec's own servers (the OpenAI frontend's ``/metrics``): counters, gauges and
histograms with labels, rendered in Prometheus' text exposition format (version 0.0.4).

One registry per served app; whoever owns a number adds it there (``registry.counter(...)``, ``registry.gauge(...)``)
and updates it: the frontend counts requests by endpoint and status and their latency; speculation metrics can be
added the same way. Thread-safe (the frontend's event loop and its tokenizer threads both update it).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)] + ([extra] if extra else [])
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


class _Metric:
    kind = ""

    def __init__(self, name: str, help_: str, labels: Sequence[str]) -> None:
        self.name = name
        self.help = help_
        self.label_names = tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def samples(self) -> list[str]:
        raise NotImplementedError

    def render(self) -> str:
        head = f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(line + "\n" for line in self.samples())


class Counter(_Metric):
    """A count that only goes up (``inc``)."""

    kind = "counter"

    def __init__(self, name: str, help_: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_, labels)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Gauge(_Metric):
    """A value that goes up and down (``set``, ``inc``, ``dec``), or is read when rendered (``function``)."""

    kind = "gauge"

    def __init__(self, name: str, help_: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_, labels)
        self._values: dict[tuple[str, ...], float] = {}
        self._function: Callable[[], float] | None = None

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)

    def function(self, read: Callable[[], float]) -> None:
        """Read the (label-less) value from ``read()`` at each render."""
        self._function = read

    def samples(self) -> list[str]:
        if self._function is not None:
            return [f"{self.name} {_number(self._function())}"]
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Histogram(_Metric):
    """Observations in cumulative buckets, with their sum and count (``observe``)."""

    kind = "histogram"

    def __init__(
        self, name: str, help_: str, labels: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> None:
        super().__init__(name, help_, labels)
        self.buckets = tuple(sorted(buckets)) + (math.inf,)
        self._values: dict[tuple[str, ...], tuple[list[int], float]] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            counts, total = self._values.get(key, ([0] * len(self.buckets), 0.0))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
            self._values[key] = (counts, total + value)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted((k, (list(c), s)) for k, (c, s) in self._values.items())
        out = []
        for key, (counts, total) in items:
            for bound, n in zip(self.buckets, counts):
                le = f'le="{_number(bound)}"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {n}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(total)}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {counts[-1]}")
        return out


class Registry:
    """The metrics of one server, rendered together by ``render()``; a name is registered once."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    def _add(self, metric: _Metric) -> _Metric:
        with self._lock:
            if metric.name in self._metrics:
                raise ValueError(f"metric {metric.name} is already registered")
            self._metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help_: str, labels: Sequence[str] = ()) -> Counter:
        return self._add(Counter(name, help_, labels))  # type: ignore[return-value]

    def gauge(self, name: str, help_: str, labels: Sequence[str] = ()) -> Gauge:
        return self._add(Gauge(name, help_, labels))  # type: ignore[return-value]

    def histogram(
        self, name: str, help_: str, labels: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> Histogram:
        return self._add(Histogram(name, help_, labels, buckets))  # type: ignore[return-value]

    def get(self, name: str) -> _Metric | None:
        return self._metrics.get(name)

    def render(self) -> str:
        with self._lock:
            metrics = list(self._metrics.values())
        return "".join(m.render() for m in metrics)
