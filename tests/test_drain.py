"""`trtspec serve` drains on SIGTERM / Ctrl-C (real tritonserver, the tiny pair through the ensemble): a stream in
flight completes, new requests get one clear error, a stream still running at --drain-timeout gets a final error.

On Triton 2.51's own shutdown (measured) the orchestrator's next engine call fails with "Server not ready" at once,
so the stream is cut mid-way; then the process does not exit after --exit-timeout-secs while a model stays live."""

from __future__ import annotations

import re
import signal
import threading

import pytest

from tests.serving_helpers import Serve, torch_spec_dict
from trtspec.errors import GenerationError
from trtspec.serving.client import TritonLLMClient
from trtspec.spec import spec_from_dict

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MAX_SEQ_LEN = 2048


@pytest.fixture(scope="module", params=["in_process", "bls"])
def repo(request, tiny_pair, tmp_path_factory):
    from trtspec.pipeline import write_repo

    root = tmp_path_factory.mktemp(f"drain-{request.param}")
    spec = spec_from_dict(
        torch_spec_dict(*tiny_pair, engine={"max_seq_len": MAX_SEQ_LEN}, triton={"orchestration": request.param}),
        base_dir=root,
        environ={},
    )
    return write_repo(spec)["path"]


def _stream(url: str, n: int, out: dict, started: threading.Event) -> None:
    """One streamed request of ``n`` tokens (end_id -1: no early end); ``out`` gets its result or its error."""
    try:
        with TritonLLMClient(url, timeout_s=300) as client:
            out["result"] = client.generate(
                "The quick brown fox", n, stream=True, end_id=-1, on_text=lambda _t: started.set()
            )
    except GenerationError as exc:
        out["error"] = exc.message
    finally:
        started.set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stream_in_flight_during_the_signal_completes_and_new_requests_are_refused(repo, sig):
    serve = Serve(repo, "--drain-timeout", "120")
    try:
        out: dict = {}
        started = threading.Event()
        worker = threading.Thread(target=_stream, args=(serve.grpc_url, 240, out, started))
        worker.start()
        assert started.wait(120) and "error" not in out, out
        serve.proc.send_signal(sig)
        # The drain starts within a poll of the models' watcher; then a new request gets one clear error.
        deadline_error = None
        for _ in range(50):
            try:
                with TritonLLMClient(serve.grpc_url, timeout_s=60) as client:
                    client.generate("hello", 2)
            except GenerationError as exc:
                deadline_error = exc.message
                break
        assert deadline_error is not None and "shutting down and admits no new requests" in deadline_error
        worker.join(300)
        assert "error" not in out, out["error"]
        assert out["result"].stats["num_output_tokens"] == 240 and out["result"].text
        assert serve.proc.wait(120) == 0
        stderr = serve.proc.stderr.read()
        # The stream, and perhaps one "hello" admitted before the models read the drain (they poll every 100 ms).
        assert re.search(r"drained in [\d.]+ s: [12] in-flight request\(s\) finished", stderr), stderr
    finally:
        serve.kill()


def test_a_stream_still_running_at_the_drain_deadline_gets_a_final_error(repo):
    # 0 s: cut at the models' next poll (100 ms); a longer deadline races the tiny pair, which can finish the stream.
    serve = Serve(repo, "--drain-timeout", "0")
    try:
        out: dict = {}
        started = threading.Event()
        worker = threading.Thread(target=_stream, args=(serve.grpc_url, MAX_SEQ_LEN - 64, out, started))
        worker.start()
        assert started.wait(120) and "error" not in out, out
        assert serve.stop() == 0
        worker.join(60)
        assert not worker.is_alive(), "the cut stream never got its final response"
        assert "drain deadline (0 s) passed" in out.get("error", ""), out
        assert (
            "drain deadline reached" in serve.stderr and "1 request(s) still running got a final error" in serve.stderr
        ), serve.stderr
    finally:
        serve.kill()
