"""trtspec torch runtime, orchestration in_process: `tensorrt_llm` with the target and the draft in this one process.

The drafter is ``speculative.drafter`` (parameter ``drafter``): the draft model, n-grams (prompt lookup + the pool in
``ngram_pool``; no draft model is loaded), the hybrid of both, or the adaptive choice per sequence and step
(trtspec.speculative.drafters.registry).

One in-flight engine (trtspec.runtimes.inflight) runs the draft-target loop for every active request: per step, one
packed draft pass per draft token and one packed target pass, no per-step IPC and no BLS. The tensor contract is the
orchestrator's (input_ids ... num_draft_tokens -> output_ids, decoded_length, is_final, statistics), checked by the
same rules (trtspec.triton_repo.orchestrator.plan_request); routed requests decode target-only in the same engine.

Decoupled (the default): execute() parses, checks and queues; the engine thread builds each request's responses
(streamed: one per step with new tokens; else one) and the responder thread sends them through the request's
response sender, with the speculation counters, in order (trtspec.triton_repo.responder: each send is an IPC round
trip the next step would otherwise wait for). Not decoupled: execute() waits for its requests and returns their
responses (no streaming).
"""

import os
import sys

# The Python backend stub ignores PYTHONPATH: the server passes trtspec's location in TRTSPEC_PYTHONPATH.
for _path in reversed(os.environ.get("TRTSPEC_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import json
import threading

import triton_python_backend_utils as pb_utils

from trtspec.errors import GenerationError
from trtspec.runtimes.inflight.contract import job_from_row, parse_request
from trtspec.triton_repo.control import ModelControl
from trtspec.triton_repo.orchestrator import Deployment, plan_request
from trtspec.triton_repo.responder import Responder
from trtspec.triton_repo.runtime_utils import as_bool, error_message, model_params, request_inputs
from trtspec.triton_repo.spec_metrics import SpeculationMetrics
from trtspec.triton_repo.stream_output import RowsOutput

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Request:
    """One Triton request's rows: their tokens accumulate on the engine thread; answered through ``tracked``
    (trtspec.triton_repo.control.Tracked: drops what is due after a cancellation or a drain cut)."""

    def __init__(self, tracked, rows, context, metrics=None, responder=None):
        self.tracked = tracked
        self.metrics = metrics  # trtspec.triton_repo.spec_metrics: every finished row's statistics
        self.responder = responder  # trtspec.triton_repo.responder (None: a request answered only by error())
        self.done = threading.Event()
        self.state = RowsOutput(rows, context)
        self.streaming = any(r.stream for r in rows)
        self.pending = len(rows)
        self.failed = False
        self.lock = threading.Lock()
        self.jobs = []

    def tokens(self, b, new, _logits, final):
        try:
            self._tokens(b, new, final)
        except Exception as exc:  # noqa: BLE001 - a response that cannot be built is an error response, never none
            self.error(exc)

    def _tokens(self, b, new, final):
        with self.lock:
            if self.failed:
                return
            self.state.out[b] += new
            if final:
                self.pending -= 1
            last = self.pending == 0
            # The arrays are built here, from the engine's state now; the IPC (tensors, send, counters) is posted.
            if self.streaming and new and not last:
                self._post(self.state.tensors(True, False), 0)
            if last:
                self._post(self.state.tensors(self.streaming, True), FINAL, self.state.stats)

    def _post(self, tensors, flags, stats=()):
        self.responder.post(lambda: self._send(tensors, flags, stats), self.error)

    def _send(self, tensors, flags, stats):
        # Counted before the final response: a client that scrapes /metrics once answered sees its request.
        if self.metrics is not None:
            for row_stats in stats:
                self.metrics.record(row_stats)
        out = [pb_utils.Tensor(k, v) for k, v in tensors.items()]
        self._answer(pb_utils.InferenceResponse(output_tensors=out), flags)

    @property
    def response(self):
        return self.tracked.response  # not decoupled: the one response, for execute() to return

    def _answer(self, response, flags):
        self.tracked.send(response, flags=flags)
        if flags == FINAL:
            self.done.set()

    def cancel(self):
        """Cancelled by the client or cut at the drain deadline (answered already): stop the rows, free their slots."""
        for job in self.jobs:
            job.cancel()
        self.done.set()

    def error(self, exc):
        with self.lock:
            if self.failed:
                return
            self.failed = True
        for job in self.jobs:  # the other rows stop too: the request has failed
            job.cancel()
        self._answer(pb_utils.InferenceResponse(error=pb_utils.TritonError(error_message(exc))), FINAL)


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from trtspec.runtimes.inflight.drafter import engine_drafter
        from trtspec.runtimes.inflight.engine import InflightEngine
        from trtspec.runtimes.torch.loading import load_model
        from trtspec.speculative.drafters.registry import entry as drafter_entry

        p = model_params(args)
        threads = int(p.get("torch_threads") or 0)
        if threads > 0:
            torch.set_num_threads(threads)
        self.exclude_default = as_bool(p.get("exclude_input_in_output"), False)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        self.context = int(p.get("stream_context_tokens") or 32)
        max_draft_len = int(p["max_draft_len"])
        self.deployment = Deployment(
            max_draft_len=max_draft_len,
            engine_max_draft_len=int(p.get("engine_max_draft_len") or max_draft_len),
            route_threshold=int(p.get("route_threshold") or 0),
            draft_logits_available=True,
            max_seq_len=int(p["max_seq_len"]),
            max_prompt_len=int(p.get("max_input_len") or p["max_seq_len"]),
            log_probs=True,
        )
        kind = p.get("drafter") or "model"  # speculative.drafter (trtspec.speculative.drafters.registry)
        pool = p.get("ngram_pool") or None  # ngram_pool.npz; none: prompt lookup only
        target = load_model(p["model_dir"], p.get("dtype") or "float32")
        if threads <= 0:  # one thread or every core, whichever decodes faster here (trtspec.threads)
            from trtspec.runtimes.torch.costs import IN_PROCESS_RESERVE, fastest_threads

            fastest_threads(target, reserve=IN_PROCESS_RESERVE)
        runs_model = drafter_entry(kind).runs_draft_model and p.get("draft_model_dir")
        draft = load_model(p["draft_model_dir"], p.get("draft_dtype") or "float32") if runs_model else None
        slots, capacity = int(p["kv_cache_slots"]), int(p["max_seq_len"])
        vocab = int(target.get_output_embeddings().weight.shape[0])
        drafter = engine_drafter(kind, draft_model=draft, pool=pool, vocab=vocab, slots=slots, capacity=capacity)
        self.engine = InflightEngine(
            target,
            drafter=drafter,
            max_batch_size=int(p["max_batch_size"]),
            slots=slots,
            capacity=capacity,
            max_queue_delay_s=int(p.get("max_queue_delay_microseconds") or 0) / 1e6,
            name=args["model_name"],
            # The adaptive drafter's pass costs timed in turn before the first request, up to max_batch_size (8 s
            # for batch 8 of SmolLM2-135M in bfloat16 on 2 cores): with curves learned from live passes alone, at
            # concurrency 8 it priced sizes it had rarely seen on one lucky pass and kept speculating (0.87-0.90x
            # target-only in process, 8 workload conversations at once; anchored 0.97x, 85 % of steps plain).
            calibrate_costs=as_bool(p.get("calibrate_costs"), True),
        ).start()
        self.control = ModelControl(pb_utils, args["model_name"])  # drain, cancellation (trtspec.triton_repo.control)
        self.metrics = SpeculationMetrics(pb_utils, args["model_name"], kind)  # on Triton's /metrics
        self.responder = Responder(args["model_name"])  # responses and counters sent off the engine thread
        source = (
            f"{kind} drafter (draft {p['draft_model_dir'] if draft is not None else 'none'}, pool {pool or 'none'})"
        )
        print(
            f"[trtspec] {args['model_name']}: target {p['model_dir']} + {source}, "
            f"pid {os.getpid()}, {torch.get_num_threads()} threads",
            flush=True,
        )

    def execute(self, requests):
        states = []
        for request in requests:
            tracked = self.control.admit(request, self.decoupled)
            if tracked.closed:  # refused while draining (answered)
                state = _Request(tracked, [], self.context)
                state.done.set()
                states.append(state)
                continue
            state = None
            try:
                rows = parse_request(
                    request_inputs(request), exclude_input_default=self.exclude_default, client_request=True
                )
                plans = [plan_request(row, self.deployment) for row in rows]  # all rows are valid before any starts
                if not self.decoupled and any(r.stream for r in rows):
                    raise GenerationError(
                        "streaming needs the decoupled transaction policy",
                        hint="set triton.decoupled: true in the spec and rewrite the repository",
                    )
                state = _Request(tracked, rows, self.context, self.metrics, self.responder)
                for b, (row, plan) in enumerate(zip(rows, plans)):
                    job = job_from_row(
                        row,
                        lambda new, lg, final, b=b, s=state: s.tokens(b, new, lg, final),
                        state.error,
                        num_draft_tokens=plan.k,
                    )
                    job.stats = state.state.stats[b]
                    if row.return_log_probs:
                        state.state.logprobs[b] = job.token_logprobs  # filled by the engine, read per response
                    job.stats.routed_to_target = plan.routed
                    self.engine.validate(job)
                    state.jobs.append(job)
                tracked.on_cancel = state.cancel  # runs at once if the request was cancelled meanwhile
                for job in state.jobs:
                    self.engine.submit(job)
            except Exception as exc:  # noqa: BLE001 - answer this request, keep serving the others
                state = _Request(tracked, [], self.context)
                state.error(exc)
            states.append(state)
        if self.decoupled:
            return None
        for state in states:
            state.done.wait()
        return [state.response for state in states]

    def finalize(self):
        self.control.close()
        self.engine.stop()
        self.responder.close()  # what the engine answered last is sent before the model goes
