"""A client that cancels its stream stops its generation and frees its KV slot (real tritonserver): the torch engine
model and the orchestrator, each asked directly; the next request is served at once, not after the cancelled one
would have finished.

The engines run one job at a time here (max_batch_size 1), so a generation that kept running after its client left
would hold the only batch slot: the next request would wait for all of its remaining tokens. The bound the test
asserts is calibrated on the cancelled stream's own token rate, not on a wall-clock guess.

Through the ensemble, Triton 2.51 does not tell a running step that its request was cancelled (measured, and kept
as a test below): a client that cancels an ensemble stream does not stop the orchestrator there."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest

from tests.serving_helpers import torch_spec_dict
from trtspec.serving.client import TritonLLMClient
from trtspec.spec import spec_from_dict

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MAX_SEQ_LEN = 4096
LONG = 3800


@pytest.fixture(scope="module", params=["bls", "in_process"])
def served(request, tiny_pair, tmp_path_factory):
    """bls: the orchestrator and two engine models; in_process: one model `tensorrt_llm` with draft and target."""
    from trtspec.pipeline import write_repo
    from trtspec.serving.server import TritonServer

    root = tmp_path_factory.mktemp(f"cancel-{request.param}")
    spec = spec_from_dict(
        torch_spec_dict(
            *tiny_pair,
            engine={"max_seq_len": MAX_SEQ_LEN, "max_batch_size": 1},
            triton={"orchestration": request.param},
        ),
        base_dir=root,
        environ={},
    )
    write_repo(spec)
    with TritonServer(spec.repo_dir, log_file=root / "server.log") as server:
        yield server


def _tensor(name, arr, dtype):
    import tritonclient.grpc as grpcclient

    x = grpcclient.InferInput(name, list(arr.shape), dtype)
    x.set_data_from_numpy(arr)
    return x


def _engine_inputs(n: int, stream: bool) -> list:
    return [
        _tensor("input_ids", np.array([[5, 6, 7, 8]], dtype=np.int32), "INT32"),
        _tensor("input_lengths", np.array([[4]], dtype=np.int32), "INT32"),
        _tensor("request_output_len", np.array([[n]], dtype=np.int32), "INT32"),
        _tensor("streaming", np.array([[stream]], dtype=bool), "BOOL"),
    ]


def _cancel_then_time_the_next(url: str, model: str) -> tuple[float, float, float]:
    """Stream LONG tokens, cancel after a while; returns (tokens/s of the stream, its remaining seconds had it run
    on, latency of an 8-token request sent right after the cancel)."""
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((time.monotonic(), error)))
    client.async_stream_infer(model, _engine_inputs(LONG, True))
    first, _ = got.get(timeout=120)
    time.sleep(1.5)
    n = got.qsize() + 1
    rate = n / (time.monotonic() - first)
    client.stop_stream(cancel_requests=True)
    client.close()
    remaining_s = (LONG - n) / rate  # responses carry one token each or more: this underestimates what was left

    other = grpcclient.InferenceServerClient(url)
    answer: queue.Queue = queue.Queue()
    other.start_stream(callback=lambda result, error: answer.put(error))
    t0 = time.monotonic()
    other.async_stream_infer(model, _engine_inputs(8, False))
    error = answer.get(timeout=remaining_s + 120)
    latency = time.monotonic() - t0
    other.stop_stream()
    other.close()
    assert error is None, error
    return rate, remaining_s, latency


def test_a_cancelled_engine_stream_frees_its_slot_for_the_next_request(served):
    rate, remaining_s, latency = _cancel_then_time_the_next(served.grpc_url, "tensorrt_llm")
    assert remaining_s > 10 * latency, (
        f"the next request took {latency:.2f} s; the cancelled stream ran at "
        f"{rate:.0f} responses/s and had {remaining_s:.1f} s left"
    )
    # And again: the freed slot is reusable, nothing accumulates.
    rate, remaining_s, latency = _cancel_then_time_the_next(served.grpc_url, "tensorrt_llm")
    assert remaining_s > 10 * latency


def _engine_requests(metrics_url: str) -> int:
    """Requests the two engine models have finished (succeeded or failed), from Triton's metrics."""
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        text = r.read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith(("nv_inference_request_success{", "nv_inference_request_failure{")) and (
            'model="tensorrt_llm"' in line or 'model="tensorrt_llm_draft"' in line
        ):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def test_a_cancelled_orchestrator_stream_stops_calling_the_engines(served):
    """The orchestrator asks the engines once or twice per step: a cancelled request must stop asking."""
    import tritonclient.grpc as grpcclient

    if not (served.repo / "tensorrt_llm_bls").is_dir():
        pytest.skip("in process: no orchestrator (the stream test above covers the one model)")

    client = grpcclient.InferenceServerClient(served.grpc_url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error))
    before = _engine_requests(served.metrics_url)
    client.async_stream_infer("tensorrt_llm_bls", _engine_inputs(LONG, True))
    assert got.get(timeout=120) is None
    time.sleep(1.5)
    running = _engine_requests(served.metrics_url)
    assert running - before > 10  # it was generating, step by step
    client.stop_stream(cancel_requests=True)
    client.close()
    time.sleep(1.0)  # the watcher's poll, and the engine call in flight
    settled = _engine_requests(served.metrics_url)
    time.sleep(2.0)
    assert _engine_requests(served.metrics_url) == settled, "the cancelled request still calls the engines"
    with TritonLLMClient(served.grpc_url) as c:  # and the server serves on
        assert c.generate("The quick brown fox", 8, end_id=-1).stats["num_output_tokens"] == 8


GEN = """
import os, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def initialize(self, args):
        self.events = os.path.join(args["model_repository"], "events.log")
    def execute(self, requests):
        for r in requests:
            threading.Thread(target=self.run, args=(r,), daemon=True).start()
    def run(self, r):
        sender, outcome = r.get_response_sender(), "finished without seeing a cancellation"
        for i in range(60):
            if r.is_cancelled():
                outcome = "saw the cancellation"
                break
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([i], dtype=np.int32))]))
            time.sleep(0.05)
        with open(self.events, "a") as f:
            f.write(f"{r.request_id()} {outcome}\\n")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
IO = (
    'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ] '
    'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]'
)


def test_triton_2_51_does_not_tell_an_ensemble_step_that_its_request_was_cancelled(tmp_path):
    """The fact behind the module docstring's limit, on a minimal decoupled Python model: asked directly, it sees the
    cancellation at its next check; inside an ensemble it never does. If this test fails, the Triton in use tells
    ensemble steps, and trtspec's watcher then stops cancelled ensemble streams too."""
    import tritonclient.grpc as grpcclient

    from trtspec.serving.server import TritonServer

    repo = tmp_path / "repo"
    (repo / "gen" / "1").mkdir(parents=True)
    (repo / "gen" / "1" / "model.py").write_text(GEN)
    (repo / "gen" / "config.pbtxt").write_text(
        'name: "gen" backend: "python" max_batch_size: 0 model_transaction_policy { decoupled: true } ' + IO
    )
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(
        'name: "ens" platform: "ensemble" max_batch_size: 0 ' + IO + " ensemble_scheduling { step [ { model_name: "
        '"gen" model_version: -1 input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }'
    )
    events = repo / "gen" / "events.log"  # args["model_repository"] is the model's own directory
    with TritonServer(repo, log_file=tmp_path / "server.log") as server:
        for model in ("gen", "ens"):
            client = grpcclient.InferenceServerClient(server.grpc_url)
            client.start_stream(callback=lambda result, error: None)
            x = grpcclient.InferInput("X", [1], "INT32")
            x.set_data_from_numpy(np.array([1], dtype=np.int32))
            client.async_stream_infer(model, [x], request_id=f"via-{model}")
            time.sleep(0.5)
            client.stop_stream(cancel_requests=True)
            client.close()
        end = time.monotonic() + 60
        while time.monotonic() < end and (not events.exists() or len(events.read_text().splitlines()) < 2):
            time.sleep(0.2)
    outcomes = dict(line.split(" ", 1) for line in events.read_text().splitlines())
    assert outcomes == {"via-gen": "saw the cancellation", "via-ens": "finished without seeing a cancellation"}
