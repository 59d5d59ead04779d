"""trtspec torch runtime for `tensorrt_llm` / `tensorrt_llm_draft`: the TensorRT-LLM backend's tensor contract served
by an in-flight batching engine over a slot KV cache with prefix reuse (trtspec.runtimes.inflight).

Decoupled: execute() only parses and queues; the engine thread answers each request through its response sender
(one response per new token when `streaming`, else one response with all tokens).
"""

import os
import sys

# The Python backend stub ignores PYTHONPATH: the server passes trtspec's location in TRTSPEC_PYTHONPATH.
for _path in reversed(os.environ.get("TRTSPEC_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import logging
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.runtimes.inflight.contract import format_output, job_from_row, parse_request
from trtspec.triton_repo.control import ModelControl
from trtspec.triton_repo.runtime_utils import as_bool, error_message, model_params, request_inputs

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Request:
    """Collects the rows of one Triton request and answers it (rows finish on the engine thread)."""

    def __init__(self, sender, rows):
        self.sender = sender
        self.rows = rows
        self.results = [None] * len(rows)
        self.pending = len(rows)
        self.failed = False
        self.lock = threading.Lock()

    def _send(self, tensors, final):
        out = [pb_utils.Tensor(k, v) for k, v in tensors.items()]
        self.sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=FINAL if final else 0)

    def tokens(self, b, new, logits, final):
        try:
            self._tokens(b, new, logits, final)
        except Exception as exc:  # noqa: BLE001 - a response that cannot be built is an error response, never none
            self.error(exc)

    def _tokens(self, b, new, logits, final):
        row = self.rows[b]
        logits_np = None if logits is None else logits.float().cpu().numpy()
        with self.lock:
            if self.failed:
                return
            if row.stream:
                # Streaming: each response carries the new tokens of one row (TRT-LLM: batch_index says which).
                if final:
                    self.pending -= 1
                last = final and self.pending == 0
                if new or last:
                    self._send(
                        format_output(new, logits=logits_np, batch_index=b if len(self.rows) > 1 else None), last
                    )
                return
            prev = self.results[b] or ([], [])
            self.results[b] = (prev[0] + new, prev[1] + ([logits_np] if logits_np is not None else []))
            if not final:
                return
            self.pending -= 1
            if self.pending == 0:
                self._send(self._batched(), True)

    def _batched(self):
        outs = []
        for row, (tokens, logits) in zip(self.rows, self.results):
            lg = np.concatenate(logits, axis=0) if logits else None
            outs.append(format_output(tokens, prompt=None if row.exclude_input else row.tokens, logits=lg))
        if len(outs) == 1:
            return outs[0]
        width = max(o["output_ids"].shape[2] for o in outs)
        ids = np.full((len(outs), 1, width), self.rows[0].end_id or 0, dtype=np.int32)
        for b, o in enumerate(outs):
            ids[b, 0, : o["output_ids"].shape[2]] = o["output_ids"][0, 0]
        merged = {"output_ids": ids, "sequence_length": np.concatenate([o["sequence_length"] for o in outs])}
        if all("generation_logits" in o for o in outs):
            n = max(o["generation_logits"].shape[2] for o in outs)
            v = outs[0]["generation_logits"].shape[3]
            lg = np.zeros((len(outs), 1, n, v), dtype=np.float32)
            for b, o in enumerate(outs):
                lg[b, 0, : o["generation_logits"].shape[2]] = o["generation_logits"][0, 0]
            merged["generation_logits"] = lg
        return merged

    def error(self, exc):
        with self.lock:
            if self.failed:
                return
            self.failed = True
        self.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error_message(exc))), flags=FINAL)


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from trtspec.runtimes.inflight.engine import InflightEngine
        from trtspec.runtimes.torch.loading import load_model

        p = model_params(args)
        threads = int(p.get("torch_threads") or 0)
        if threads > 0:
            torch.set_num_threads(threads)
        self.exclude_default = as_bool(p.get("exclude_input_in_output"), False)
        self.log = logging.getLogger(args["model_name"])
        model = load_model(p["model_dir"], p.get("dtype") or "float32")
        if threads <= 0:  # one thread or every core but the server's, whichever decodes faster here (trtspec.threads)
            from trtspec.runtimes.torch.costs import SERVED_RESERVE, fastest_threads

            fastest_threads(model, reserve=SERVED_RESERVE)
        self.engine = InflightEngine(
            model,
            max_batch_size=int(p["max_batch_size"]),
            slots=int(p["kv_cache_slots"]),
            capacity=int(p["max_seq_len"]),
            max_queue_delay_s=int(p.get("max_queue_delay_microseconds") or 0) / 1e6,
            name=args["model_name"],
        ).start()
        self.control = ModelControl(pb_utils, args["model_name"])  # drain, cancellation (trtspec.triton_repo.control)
        print(
            f"[trtspec] {args['model_name']}: {p['model_dir']} ({p.get('dtype')}), pid {os.getpid()}, "
            f"{torch.get_num_threads()} threads",
            flush=True,
        )

    def execute(self, requests):
        for request in requests:
            sender = self.control.admit(request)  # its send() replaces the response sender's
            if sender.closed:
                continue  # refused while draining (answered)
            try:
                rows = parse_request(request_inputs(request), exclude_input_default=self.exclude_default)
                state = _Request(sender, rows)
                jobs = [
                    job_from_row(row, lambda new, lg, final, b=b, s=state: s.tokens(b, new, lg, final), state.error)
                    for b, row in enumerate(rows)
                ]
                for job in jobs:  # all rows are valid before any starts
                    self.engine.validate(job)
                # Cancelled or cut: the engine stops a cancelled job at its next pass and frees its slot.
                sender.on_cancel = lambda jobs=jobs: [job.cancel() for job in jobs]
                for job in jobs:
                    self.engine.submit(job)
            except Exception as exc:  # noqa: BLE001 - answer this request, keep serving the others
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error_message(exc))), flags=FINAL)
        return None

    def finalize(self):
        self.control.close()
        self.engine.stop()
