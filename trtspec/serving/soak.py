"""A bounded soak of a served ensemble: many concurrent requests, some malformed, every answer checked.

Good requests are greedy, streamed or not; each one's text must equal the text the same server gave that prompt at
concurrency 1 (the reference pass). Malformed requests (missing ``text_input``, ``max_tokens`` 0 or -1, invalid
UTF-8, a prompt beyond ``max_seq_len``) must each get an error response. Counted: dead Python-backend stubs (and
``segfault`` lines in dmesg where it is readable), errors on good requests, wrong texts, hangs (no final response
within the per-request timeout), malformed requests answered without an error, and output tokens per second.
Used by ``benchmarks/serving_soak.py`` and by the stress test in the test suite.
"""

from __future__ import annotations

import queue
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.request_fields import NUMPY_TYPES
from trtspec.serving.contract import input_types
from trtspec.triton_repo.names import ENSEMBLE

STATS = ("num_output_tokens", "total_draft_tokens", "total_accepted_draft_tokens")
MALFORMED_KINDS = ("missing_text_input", "max_tokens_0", "max_tokens_negative", "invalid_utf8", "prompt_too_long")
STUB_NAME = "triton_python_backend_stub"


@dataclass
class SoakResult:
    """What a soak saw; ``ok`` when nothing went wrong."""

    requests: int = 0
    good: int = 0
    malformed: int = 0
    errors_on_good: list[str] = field(default_factory=list)
    wrong_texts: list[str] = field(default_factory=list)
    hangs: int = 0
    malformed_accepted: list[str] = field(default_factory=list)
    dead_stubs: list[str] = field(default_factory=list)
    segfaults: list[str] = field(default_factory=list)
    backend_failures: int = 0
    output_tokens: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    wall_s: float = 0.0
    completed: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.errors_on_good
            or self.wrong_texts
            or self.hangs
            or self.malformed_accepted
            or self.dead_stubs
            or self.segfaults
        )

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "completed": self.completed,
            "good": self.good,
            "malformed": self.malformed,
            "dead_stubs": len(self.dead_stubs),
            "segfaults": len(self.segfaults),
            "errors_on_good": len(self.errors_on_good),
            "wrong_texts": len(self.wrong_texts),
            "hangs": self.hangs,
            "malformed_accepted": len(self.malformed_accepted),
            "backend_failures": self.backend_failures,
            "output_tokens": self.output_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "wall_s": round(self.wall_s, 2),
            "tokens_per_s": round(self.tokens_per_s, 2),
        }


# -- the server's processes ------------------------------------------------------------------------------------------
def stub_processes(server_pid: int) -> dict[int, str]:
    """pid -> model instance name of every Python-backend stub started by ``server_pid``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != server_pid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if argv and argv[0].endswith(STUB_NAME.encode()):
            # argv: stub, model path, shm region, sizes, parent pid, libpython dir, ipc handle, instance name, ...
            name = next((a.decode() for a in argv[7:9] if a and not a.isdigit()), argv[1].decode())
            found[int(entry.name)] = name
    return found


def dmesg_segfaults() -> list[str] | None:
    """``segfault`` lines of the kernel log mentioning the stub, or None when the log is not readable here."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [line for line in out.stdout.splitlines() if "segfault" in line and "triton_python" in line]


def backend_failures(metrics_url: str) -> int:
    """``nv_inference_request_failure{reason="BACKEND"}`` summed over models (what a dead stub increments); -1 when
    unknown (no metrics URL, or it did not answer)."""
    import urllib.request

    if not metrics_url:
        return -1
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as r:
            text = r.read().decode("utf-8")
    except OSError:
        return -1
    total = 0
    for line in text.splitlines():
        if line.startswith("nv_inference_request_failure") and 'reason="BACKEND"' in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


# -- requests ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SoakRequest:
    kind: str  # "good" or one of MALFORMED_KINDS
    prompt: str
    max_tokens: int
    stream: bool
    options: tuple[tuple[str, Any], ...] = ()  # more ensemble inputs, e.g. (("temperature", 0.8),)


def plan_requests(
    prompts: Sequence[str], n: int, malformed_fraction: float, max_tokens: int, *, long_prompt: str, seed: int = 0
) -> list[SoakRequest]:
    """``n`` requests: about ``malformed_fraction`` of them malformed (kinds in turn), the rest good, half streamed."""
    rng = random.Random(seed)
    n_bad = round(n * malformed_fraction)
    out = [
        SoakRequest(
            MALFORMED_KINDS[i % len(MALFORMED_KINDS)],
            long_prompt
            if MALFORMED_KINDS[i % len(MALFORMED_KINDS)] == "prompt_too_long"
            else prompts[i % len(prompts)],
            max_tokens,
            bool(i % 2),
        )
        for i in range(n_bad)
    ]
    out += [SoakRequest("good", prompts[i % len(prompts)], max_tokens, bool(i % 2)) for i in range(n - n_bad)]
    rng.shuffle(out)
    return out


class StreamClient:
    """One gRPC bidirectional stream to the ensemble; one request at a time (one client per worker thread)."""

    def __init__(self, url: str, model: str = ENSEMBLE) -> None:
        import tritonclient.grpc as grpcclient

        self.url, self.model = url, model
        self._responses: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url)
        self.client.start_stream(callback=lambda result, error: self._responses.put((result, error)))

    def close(self) -> None:
        try:
            self.client.stop_stream(cancel_requests=True)
        except Exception:  # noqa: BLE001 - closing a broken stream
            pass
        self.client.close()

    def send(self, req: SoakRequest, timeout_s: float) -> tuple[str | None, str | None, dict[str, int]]:
        """(text, error message, statistics); text None and error "hang" when no final response came in time."""
        import numpy as np
        import tritonclient.grpc as grpcclient

        def tensor(name: str, arr: np.ndarray, dtype: str) -> Any:
            x = grpcclient.InferInput(name, list(arr.shape), dtype)
            x.set_data_from_numpy(arr)
            return x

        inputs = []
        if req.kind != "missing_text_input":
            raw = b"\xff\xfe broken \xc3" if req.kind == "invalid_utf8" else req.prompt.encode("utf-8")
            inputs.append(tensor("text_input", np.array([[raw]], dtype=np.object_), "BYTES"))
        n = {"max_tokens_0": 0, "max_tokens_negative": -1}.get(req.kind, req.max_tokens)
        inputs.append(tensor("max_tokens", np.array([[n]], dtype=np.int32), "INT32"))
        inputs.append(tensor("stream", np.array([[req.stream]], dtype=np.bool_), "BOOL"))
        inputs.append(tensor("exclude_input_in_output", np.array([[True]], dtype=np.bool_), "BOOL"))
        types = input_types()  # the ensemble's declared inputs (trtspec.triton_repo.tensors)
        for name, value in req.options:
            dtype = types[name]
            inputs.append(tensor(name, np.array([[value]], dtype=getattr(np, NUMPY_TYPES[dtype])), dtype))
        outputs = [grpcclient.InferRequestedOutput(x) for x in ("text_output", *STATS)]
        request_id = uuid.uuid4().hex
        self.client.async_stream_infer(
            self.model, inputs, outputs=outputs, request_id=request_id, enable_empty_final_response=True
        )
        deadline = time.monotonic() + timeout_s
        text: list[str] = []
        stats: dict[str, int] = {}
        while True:
            try:
                result, error = self._responses.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                return None, "hang", stats
            if error is not None:
                return "".join(text), str(error.message() if hasattr(error, "message") else error), stats
            response = result.get_response()
            if response.id and response.id != request_id:
                continue
            out = result.as_numpy("text_output")
            if out is not None:
                text.append(b"".join(bytes(t) for t in out.reshape(-1)).decode("utf-8", errors="replace"))
            for name in STATS:
                value = result.as_numpy(name)
                if value is not None:
                    stats[name] = int(value.reshape(-1)[0])
            final = response.parameters.get("triton_final_response")
            if final is None or final.bool_param:
                return "".join(text), None, stats


def reference_texts(
    url: str,
    prompts: Sequence[str],
    max_tokens: int,
    timeout_s: float = 120.0,
    options: tuple[tuple[str, Any], ...] = (),
) -> dict[str, str]:
    """Each prompt's greedy text from the server at concurrency 1 (non-streamed)."""
    client = StreamClient(url)
    try:
        refs = {}
        for p in dict.fromkeys(prompts):
            text, error, _ = client.send(SoakRequest("good", p, max_tokens, False, options), timeout_s)
            if error is not None or text is None:
                raise RuntimeError(f"reference request failed: {error}")
            refs[p] = text
        return refs
    finally:
        client.close()


def run_soak(
    url: str,
    server_pid: int,
    metrics_url: str,
    requests: Sequence[SoakRequest],
    concurrency: int,
    references: dict[str, str],
    *,
    timeout_s: float = 120.0,
    time_limit_s: float = 1800.0,
    progress: Callable[[int, int], None] | None = None,
) -> SoakResult:
    """Send ``requests`` from ``concurrency`` threads and check every answer (see module docstring)."""
    result = SoakResult(requests=len(requests))
    stubs_before = stub_processes(server_pid)
    dmesg_before = set(dmesg_segfaults() or [])
    failures_before = backend_failures(metrics_url)
    todo: queue.Queue[SoakRequest] = queue.Queue()
    for r in requests:
        todo.put(r)
    lock = threading.Lock()
    stop_at = time.monotonic() + time_limit_s

    def worker() -> None:
        client = StreamClient(url)
        try:
            while time.monotonic() < stop_at:
                try:
                    req = todo.get_nowait()
                except queue.Empty:
                    return
                text, error, stats = client.send(req, timeout_s)
                with lock:
                    result.completed += 1
                    if req.kind == "good":
                        result.good += 1
                        if error == "hang":
                            result.hangs += 1
                        elif error is not None:
                            result.errors_on_good.append(error)
                        elif req.prompt in references and text != references[req.prompt]:
                            result.wrong_texts.append(req.prompt)
                        result.output_tokens += stats.get("num_output_tokens", 0)
                        result.draft_tokens += stats.get("total_draft_tokens", 0)
                        result.accepted_draft_tokens += stats.get("total_accepted_draft_tokens", 0)
                    else:
                        result.malformed += 1
                        if error == "hang":
                            result.hangs += 1
                        elif error is None:
                            result.malformed_accepted.append(req.kind)
                    done = result.completed
                if error == "hang":  # the stream may be stuck behind the lost request: start a fresh one
                    client.close()
                    client = StreamClient(url)
                if progress is not None:
                    progress(done, len(requests))
        finally:
            client.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, stop_at - time.monotonic() + timeout_s + 10))
    result.wall_s = time.perf_counter() - t0
    stubs_after = stub_processes(server_pid)
    result.dead_stubs = sorted(name for pid, name in stubs_before.items() if pid not in stubs_after)
    after = dmesg_segfaults()
    result.segfaults = sorted(set(after or []) - dmesg_before)
    failures_after = backend_failures(metrics_url)
    if failures_before >= 0 and failures_after >= 0:
        result.backend_failures = failures_after - failures_before
    return result


def long_prompt(max_seq_len: int) -> str:
    """A prompt whose tokens exceed ``max_seq_len`` with any tokenizer (one token per word, or more)."""
    return " ".join(["overflow"] * (max_seq_len + 8))
