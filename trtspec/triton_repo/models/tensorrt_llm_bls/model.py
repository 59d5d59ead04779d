"""trtspec tensorrt_llm_bls: the draft-target orchestrator (trtspec.triton_repo.orchestrator) over BLS requests to
`tensorrt_llm_draft` and `tensorrt_llm`.

Streaming (decoupled) and not, any number of concurrent requests (async execute: one coroutine per request, its
engine calls awaited), batch > 1 (rows run concurrently), routing of short requests to the target alone, and
per-request statistics in the output tensors. Requests are parsed by the same parser as the engine models
(trtspec.runtimes.inflight.contract) and checked against what the engines were built for before any engine call.
Every BLS response iterator outlives the stub's own reference to it (trtspec.triton_repo.bls_lifetime).
"""

import os
import sys

# The Python backend stub ignores PYTHONPATH: the server passes trtspec's location in TRTSPEC_PYTHONPATH.
for _path in reversed(os.environ.get("TRTSPEC_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import asyncio
import contextlib
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.errors import GenerationError, RequestCancelled
from trtspec.runtimes.inflight.contract import engine_inputs, parse_request
from trtspec.triton_repo.bls_lifetime import IteratorJanitor
from trtspec.triton_repo.control import INTERNAL_PARAMETERS, ModelControl
from trtspec.triton_repo.orchestrator import Deployment, generate, plan_request
from trtspec.triton_repo.runtime_utils import as_bool, error_message, model_params, request_inputs
from trtspec.triton_repo.spec_metrics import SpeculationMetrics
from trtspec.triton_repo.stream_output import RowsOutput

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class BlsEngines:
    """The orchestrator's EngineClient for one served request: one BLS request per engine call.

    Every BLS response iterator is retired through the model's IteratorJanitor and released only after a barrier
    on the served request (trtspec.triton_repo.bls_lifetime explains the stub bug this avoids)."""

    def __init__(self, executor, janitor, served):
        self.executor = executor
        self.janitor = janitor
        self.served = served  # trtspec.triton_repo.control.Tracked: its is_cancelled() calls are serialized

    async def barrier(self):
        """True when the served request is cancelled or closed (the lifetime barrier's answer, for free)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.janitor.barrier, self.served.poll_cancelled)

    async def generate(self, model, row):
        t = [pb_utils.Tensor(name, value) for name, value in engine_inputs(row).items()]
        want_logits = row.return_logits
        names = ["output_ids", "sequence_length"] + (["generation_logits"] if want_logits else [])
        request = pb_utils.InferenceRequest(
            model_name=model, inputs=t, requested_output_names=names, parameters=INTERNAL_PARAMETERS
        )  # served while draining
        loop = asyncio.get_running_loop()
        responses = await request.async_exec(decoupled=True)
        cancelled = False
        try:
            while True:
                # Waiting for the next response blocks: do it off the event loop, so other requests keep running.
                r = await loop.run_in_executor(self.executor, next, responses, None)
                if r is None:
                    break
                if r.has_error():
                    raise GenerationError(f"{model}: {r.error().message()}")
                ids = pb_utils.get_output_tensor_by_name(r, "output_ids")
                if ids is None:
                    continue  # an empty final response
                n = int(pb_utils.get_output_tensor_by_name(r, "sequence_length").as_numpy().reshape(-1)[0])
                tokens_out = ids.as_numpy().reshape(-1)[:n].tolist()
                logits = None
                if want_logits:
                    lg = pb_utils.get_output_tensor_by_name(r, "generation_logits")
                    # A copy: the response's own array is released with the iterator.
                    logits = (
                        None
                        if lg is None
                        else np.array(lg.as_numpy(), dtype=np.float32, copy=True).reshape(-1, lg.shape()[-1])
                    )
                del ids, r
                yield tokens_out, logits
        finally:
            # Never let this frame drop the last reference: finish and park the iterator, then prove the stub has
            # erased it before releasing it (trtspec.triton_repo.bls_lifetime).
            await loop.run_in_executor(self.executor, self.janitor.retire, responses)
            del responses
            cancelled = await self.barrier()
        if cancelled:  # the client went away: stop this request's draft-target loop here
            raise RequestCancelled("the request was cancelled", hint="the client cancelled it or went away")


def _load_drafter(kind, pool_file, version_dir):
    """speculative.drafter's BLS-side drafter from its registry entry (None for ``model``: the draft engine proposes),
    over the n-gram pool shipped in this model's directory (none: prompt lookup only)."""
    from trtspec.speculative.drafters.ngram import NgramPool
    from trtspec.speculative.drafters.registry import DrafterContext, entry, local_drafter

    pool = NgramPool.load(os.path.join(version_dir, pool_file)) if pool_file and entry(kind).uses_pool else None
    ctx = DrafterContext(pool=pool, has_draft_engine=entry(kind).runs_draft_model)
    print(f"[trtspec] tensorrt_llm_bls: {kind} drafter, pool {pool_file or 'none (prompt lookup only)'}", flush=True)
    return local_drafter(kind, ctx)


class TritonPythonModel:
    def initialize(self, args):
        p = model_params(args)
        self.deployment = Deployment(
            target_model=p["tensorrt_llm_model_name"],
            draft_model=p["tensorrt_llm_draft_model_name"],
            max_draft_len=int(p["max_draft_len"]),
            engine_max_draft_len=int(p.get("engine_max_draft_len") or p["max_draft_len"]),
            route_threshold=int(p["route_threshold"]),
            use_draft_logits=as_bool(p.get("use_draft_logits")),
            draft_logits_available=as_bool(p.get("engine_generation_logits")),
            exact_penalties=as_bool(p.get("engine_exact_penalties")),
            max_seq_len=int(p["max_seq_len"]),
            max_input_len=int(p.get("engine_max_input_len") or int(p["max_seq_len"]) - 1),
            max_prompt_len=int(p.get("max_input_len") or p["max_seq_len"]),
        )
        self.drafter = _load_drafter(
            p.get("drafter") or "model",
            p.get("ngram_pool") or "",
            os.path.join(args["model_repository"], str(args["model_version"])),
        )
        self.exclude_default = as_bool(p.get("exclude_input_in_output"))
        self.context = int(p.get("stream_context_tokens") or 32)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        # Each in-flight engine call parks one thread while it waits: size the pool for many concurrent requests.
        self.executor = ThreadPoolExecutor(max_workers=256, thread_name_prefix="trtspec-bls")
        self.janitor = IteratorJanitor()
        self.control = ModelControl(pb_utils, args["model_name"])  # drain, cancellation (trtspec.triton_repo.control)
        self.metrics = SpeculationMetrics(pb_utils, args["model_name"], p.get("drafter") or "model")  # /metrics

    async def execute(self, requests):
        loop = asyncio.get_running_loop()
        loop.set_default_executor(self.executor)  # async_exec runs its blocking part on the default executor
        senders = [self.control.admit(r, self.decoupled) for r in requests]  # closed: refused while draining
        await asyncio.gather(*[self._serve(r, s) for r, s in zip(requests, senders) if not s.closed])
        return None if self.decoupled else [s.response for s in senders]

    async def _serve(self, request, sender):
        try:
            rows = parse_request(
                request_inputs(request), exclude_input_default=self.exclude_default, client_request=True
            )
            for row in rows:  # every row is servable before any starts
                plan_request(row, self.deployment)
            streaming = any(r.stream for r in rows)
            if streaming and not self.decoupled:
                raise GenerationError(
                    "streaming needs the decoupled transaction policy",
                    hint="set triton.decoupled: true in the spec and rewrite the repository",
                )
            state = RowsOutput(rows, self.context)
            engines = BlsEngines(self.executor, self.janitor, sender)

            def send_partial():
                out = [pb_utils.Tensor(k, v) for k, v in state.tensors(True, False).items()]
                sender.send(pb_utils.InferenceResponse(output_tensors=out))

            async def run(b):
                # aclosing: leaving early closes the steps now, so their iterators are retired before we answer.
                steps = generate(rows[b], engines, self.deployment, state.stats[b], drafter=self.drafter)
                async with contextlib.aclosing(steps):
                    async for tokens in steps:
                        if sender.cancelled:  # by the client, or cut at the drain deadline: answered already
                            raise RequestCancelled("the request was cancelled", hint="the client cancelled it")
                        state.out[b] += tokens
                        if streaming:
                            send_partial()

            # return_exceptions: every row (and its iterators' barriers) ends before the final response is sent.
            outcomes = await asyncio.gather(*[run(b) for b in range(len(rows))], return_exceptions=True)
            failed = next((o for o in outcomes if isinstance(o, BaseException)), None)
            if failed is not None:
                raise failed
            out = [pb_utils.Tensor(k, v) for k, v in state.tensors(streaming, True).items()]
            response = pb_utils.InferenceResponse(output_tensors=out)
            for stats in state.stats:
                self.metrics.record(stats)
        except Exception as exc:  # noqa: BLE001 - an error response; the model keeps serving
            if self.control.cut_at_deadline(sender):
                return  # past the drain deadline the failure is the engines' cut: the client gets the drain's error
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(error_message(exc)))
        sender.send(response, flags=FINAL)

    def finalize(self):
        self.control.close()
