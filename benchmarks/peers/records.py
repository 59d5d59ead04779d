"""The pure parts of the peers benchmark (benchmarks/peers_cpu.py): percentiles, the per-token decode time, the fold of
an OpenAI stream from any of the three servers, summaries, greedy text identity and the table's rows. No installs,
no servers (tests/test_peers_bench.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

MODE_LABELS = {"target": "target-only", "ngram": "n-gram", "draft": "draft model"}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default); None if empty."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def decode_ms(e2e_p50_s: float | None, ttft_p50_s: float | None, tokens: float | None) -> float | None:
    """Per-token decode time in ms: (E2E p50 - TTFT p50) / (tokens - 1); None when it cannot be computed."""
    if e2e_p50_s is None or ttft_p50_s is None or tokens is None or tokens <= 1:
        return None
    return (e2e_p50_s - ttft_p50_s) / (tokens - 1) * 1000.0


@dataclass
class Record:
    """One streamed request as the client saw it (seconds from sending it)."""

    prompt: int = 0
    text: str = ""
    tokens: int = 0  # the client's count: the text in the target's tokenizer, the same rule for every server
    server_tokens: int | None = None  # the server's usage.completion_tokens (vLLM and llama.cpp count the EOS)
    ttft: float | None = None
    itl: float | None = None  # (last text - first text) / (tokens - 1)
    latency: float = 0.0
    drafted: int | None = None  # the server's own count, where its response carries one
    accepted: int | None = None
    error: str | None = None


class StreamState:
    """Folds the server-sent events of one streamed chat completion into a Record (no I/O: testable)."""

    def __init__(self, prompt: int = 0) -> None:
        self.record = Record(prompt=prompt)
        self.chunks: list[str] = []
        self.times: list[float] = []
        self.usage_tokens: int | None = None
        self.predicted_n: int | None = None

    def event(self, event: dict[str, Any], t: float) -> None:
        if "error" in event:
            err = event["error"]
            raise RuntimeError(f"server: {err.get('message') if isinstance(err, dict) else err}")
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                self.chunks.append(text)
                self.times.append(t)
        usage = event.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.usage_tokens = int(usage["completion_tokens"])
        spec = event.get("speculative_decoding")  # trtspec's extension
        if spec and spec.get("total_draft_tokens") is not None:
            self.record.drafted = int(spec["total_draft_tokens"])
            self.record.accepted = int(spec.get("total_accepted_draft_tokens") or 0)
        timings = event.get("timings")  # llama.cpp's
        if timings:
            if timings.get("predicted_n") is not None:
                self.predicted_n = int(timings["predicted_n"])
            if timings.get("draft_n") is not None:
                self.record.drafted = int(timings["draft_n"])
                self.record.accepted = int(timings.get("draft_n_accepted") or 0)

    def finish(self, latency: float, count: Callable[[str], int] | None = None) -> Record:
        """The record; ``count`` (text -> tokens) makes the token count the client's own, else the server's."""
        r = self.record
        r.text = "".join(self.chunks)
        r.server_tokens = self.usage_tokens if self.usage_tokens is not None else self.predicted_n
        r.tokens = count(r.text) if count else (r.server_tokens if r.server_tokens is not None else len(self.chunks))
        r.latency = latency
        if self.times:
            r.ttft = self.times[0]
            if r.tokens > 1 and len(self.times) > 1:
                r.itl = (self.times[-1] - self.times[0]) / (r.tokens - 1)
        return r


def parse_sse_line(raw: bytes) -> dict[str, Any] | None | str:
    """One line of a server-sent event stream: the JSON event, "done" for ``[DONE]``, None for anything else."""
    line = raw.decode("utf-8").strip()
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]":
        return "done"
    return json.loads(data)


def prometheus_sum(text: str, name: str) -> float | None:
    """The sum of every sample of metric ``name`` (any labels) in a Prometheus text scrape; None if absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest and rest[0] not in " {":
            continue  # a longer name with this prefix (e.g. name_created)
        try:
            total += float(line.rsplit(None, 1)[-1])
            seen = True
        except ValueError:
            continue
    return total if seen else None


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def identity(texts: Sequence[str], reference: Sequence[str]) -> dict[str, Any]:
    """Greedy text identity prompt by prompt: how many texts equal the reference, and each shared prefix (chars)."""
    pairs = list(zip(texts, reference, strict=False))
    return {
        "identical": sum(1 for t, r in pairs if t == r),
        "of": len(pairs),
        "common_prefix_chars": [common_prefix(t, r) for t, r in pairs],
        "reference_chars": [len(r) for _, r in pairs],
    }


def summarize(records: Sequence[Record], wall_s: float) -> dict[str, Any]:
    """The figures of one mode at concurrency 1: throughput, latency percentiles, decode ms, acceptance."""
    ok = [r for r in records if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [r.itl for r in ok if r.itl is not None]
    e2e = [r.latency for r in ok]
    tokens = [float(r.tokens) for r in ok]
    total = sum(r.tokens for r in ok)
    ttft50, e2e50, tok50 = percentile(ttft, 50), percentile(e2e, 50), percentile(tokens, 50)
    drafted = [r for r in ok if r.drafted is not None]
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "output_tokens": total,
        "tok_s": total / wall_s if wall_s > 0 else None,
        "ttft_p50_s": ttft50,
        "ttft_p90_s": percentile(ttft, 90),
        "itl_p50_s": percentile(itl, 50),
        "itl_p90_s": percentile(itl, 90),
        "e2e_p50_s": e2e50,
        "tokens_p50": tok50,
        "decode_ms": decode_ms(e2e50, ttft50, tok50),
        "drafted": sum(r.drafted or 0 for r in drafted) if drafted else None,
        "accepted": sum(r.accepted or 0 for r in drafted) if drafted else None,
    }


def acceptance(drafted: float | None, accepted: float | None) -> float | None:
    return accepted / drafted if drafted else None


def _f(x: float | None, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x * scale)


COLUMNS = (
    "server",
    "mode",
    "tok/s c1",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "ITL p50 ms",
    "ITL p90 ms",
    "decode ms/token",
    "acceptance",
    "same text as trtspec target-only",
    "tok/s c8",
)


def table_rows(results: dict[str, dict[str, dict[str, Any]]]) -> list[list[str]]:
    """One row per server and mode, in COLUMNS' order, from ``results[server][mode]``."""
    rows = []
    for server, modes in results.items():
        for mode, r in modes.items():
            if r.get("error"):
                rows.append([server, MODE_LABELS.get(mode, mode), f"failed: {r['error'][:60]}"] + [""] * 8)
                continue
            s = r["c1"]
            ident = r.get("identity")
            c8 = r.get("c8") or {}
            rows.append(
                [
                    server,
                    MODE_LABELS.get(mode, mode),
                    _f(s["tok_s"]),
                    _f(s["ttft_p50_s"], 1000, "{:.0f}"),
                    _f(s["ttft_p90_s"], 1000, "{:.0f}"),
                    _f(s["itl_p50_s"], 1000),
                    _f(s["itl_p90_s"], 1000),
                    _f(s["decode_ms"]),
                    _f(r.get("acceptance"), 1, "{:.2f}"),
                    f"{ident['identical']}/{ident['of']}" if ident else "-",
                    _f(c8.get("tok_s")),
                ]
            )
    return rows
