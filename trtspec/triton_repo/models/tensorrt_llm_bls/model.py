"""trtspec tensorrt_llm_bls: the draft-target orchestrator (trtspec.triton_repo.orchestrator) over BLS requests to
`tensorrt_llm_draft` and `tensorrt_llm`.

Streaming (decoupled) and not, any number of concurrent requests (async execute: one coroutine per request, its
engine calls awaited), batch > 1 (rows run concurrently), routing of short requests to the target alone, and
per-request statistics in the output tensors.
"""

import os
import sys

# The Python backend stub ignores PYTHONPATH: the server passes trtspec's location in TRTSPEC_PYTHONPATH.
for _path in reversed(os.environ.get("TRTSPEC_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.engines.inflight.contract import decode_word_list
from trtspec.errors import GenerationError
from trtspec.triton_repo.orchestrator import MAX_DRAFT_LEN, Deployment, GenRequest, GenStats, StepParams, generate
from trtspec.triton_repo.runtime_utils import as_bool, error_message, model_params, request_inputs, scalar_rows

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class BlsEngines:
    """The orchestrator's EngineClient: one BLS request per engine call."""

    def __init__(self, executor):
        self.executor = executor

    async def generate(self, model, tokens, max_new, params, *, draft=None, draft_logits=None, stream=False,
                       want_logits=False):
        t = [
            pb_utils.Tensor("input_ids", np.asarray([tokens], dtype=np.int32)),
            pb_utils.Tensor("input_lengths", np.asarray([[len(tokens)]], dtype=np.int32)),
            pb_utils.Tensor("request_output_len", np.asarray([[max_new]], dtype=np.int32)),
            pb_utils.Tensor("streaming", np.asarray([[stream]], dtype=np.bool_)),
            pb_utils.Tensor("exclude_input_in_output", np.asarray([[True]], dtype=np.bool_)),
            pb_utils.Tensor("pad_id", np.asarray([[params.pad_id]], dtype=np.int32)),
            pb_utils.Tensor("temperature", np.asarray([[params.temperature]], dtype=np.float32)),
            pb_utils.Tensor("runtime_top_k", np.asarray([[params.top_k]], dtype=np.int32)),
            pb_utils.Tensor("runtime_top_p", np.asarray([[params.top_p]], dtype=np.float32)),
            pb_utils.Tensor("return_generation_logits", np.asarray([[want_logits]], dtype=np.bool_)),
        ]
        if params.end_id is not None:
            t.append(pb_utils.Tensor("end_id", np.asarray([[params.end_id]], dtype=np.int32)))
        if params.seed is not None:
            t.append(pb_utils.Tensor("seed", np.asarray([[params.seed]], dtype=np.uint64)))
        if params.stop_words:
            t.append(pb_utils.Tensor("stop_words_list", _word_list(params.stop_words)))
        if params.bad_words:
            t.append(pb_utils.Tensor("bad_words_list", _word_list(params.bad_words)))
        if draft:
            t.append(pb_utils.Tensor("draft_input_ids", np.asarray([draft], dtype=np.int32)))
            if draft_logits is not None:
                t.append(pb_utils.Tensor("draft_logits", np.asarray(draft_logits, dtype=np.float32)[None]))
        names = ["output_ids", "sequence_length"] + (["generation_logits"] if want_logits else [])
        request = pb_utils.InferenceRequest(model_name=model, inputs=t, requested_output_names=names)
        responses = await request.async_exec(decoupled=True)
        loop = asyncio.get_running_loop()
        it = iter(responses)
        while True:
            # Waiting for the next response blocks: do it off the event loop, so other requests keep running.
            r = await loop.run_in_executor(self.executor, next, it, None)
            if r is None:
                return
            if r.has_error():
                raise GenerationError(f"{model}: {r.error().message()}")
            ids = pb_utils.get_output_tensor_by_name(r, "output_ids")
            if ids is None:
                continue  # an empty final response
            ids = ids.as_numpy()
            n = int(pb_utils.get_output_tensor_by_name(r, "sequence_length").as_numpy().reshape(-1)[0])
            lg = pb_utils.get_output_tensor_by_name(r, "generation_logits") if want_logits else None
            yield ids.reshape(-1)[:n].tolist(), (None if lg is None else lg.as_numpy().reshape(-1, lg.shape()[-1]))


def _word_list(words):
    from trtspec.engines.inflight.contract import encode_word_list

    return encode_word_list([list(w) for w in words])[None]


class _Rows:
    """The rows of one request: their generated tokens, statistics, and response tensors."""

    def __init__(self, prompts, context):
        self.prompts = prompts
        self.out = [[] for _ in prompts]
        self.sent = [0 for _ in prompts]
        self.stats = [GenStats() for _ in prompts]
        self.context = context

    def tensors(self, streaming, exclude_input, final):
        batch = len(self.prompts)
        seqs, decoded = [], []
        for b in range(batch):
            if streaming:
                start = max(0, self.sent[b] - self.context)  # a little context for exact incremental decoding
                seqs.append(self.out[b][start:])
                decoded.append(self.sent[b] - start)
                self.sent[b] = len(self.out[b])
            else:
                seqs.append(self.out[b] if exclude_input[b] else self.prompts[b] + self.out[b])
                decoded.append(0)
        width = max(1, max(len(s) for s in seqs))
        ids = np.zeros((batch, 1, width), dtype=np.int32)
        for b, s in enumerate(seqs):
            ids[b, 0, : len(s)] = s
        st = self.stats
        col = lambda vals, dtype: np.asarray(vals, dtype=dtype).reshape(batch, 1)  # noqa: E731
        return [
            pb_utils.Tensor("output_ids", ids),
            pb_utils.Tensor("sequence_length", col([len(s) for s in seqs], np.int32)),
            pb_utils.Tensor("decoded_length", col(decoded, np.int32)),
            pb_utils.Tensor("is_final", col([final] * batch, np.bool_)),
            pb_utils.Tensor("acceptance_rate", col([s.acceptance_rate for s in st], np.float32)),
            pb_utils.Tensor("total_accepted_draft_tokens", col([s.accepted_tokens for s in st], np.int32)),
            pb_utils.Tensor("total_draft_tokens", col([s.draft_tokens for s in st], np.int32)),
            pb_utils.Tensor("num_input_tokens", col([len(p) for p in self.prompts], np.int32)),
            pb_utils.Tensor("num_output_tokens", col([len(o) for o in self.out], np.int32)),
            pb_utils.Tensor("arrival_time_ns", col([s.arrival_ns for s in st], np.int64)),
            pb_utils.Tensor("first_token_time_ns", col([s.first_token_ns for s in st], np.int64)),
            pb_utils.Tensor("last_token_time_ns", col([s.last_token_ns for s in st], np.int64)),
        ]


class TritonPythonModel:
    def initialize(self, args):
        p = model_params(args)
        self.deployment = Deployment(
            target_model=p["tensorrt_llm_model_name"], draft_model=p["tensorrt_llm_draft_model_name"],
            max_draft_len=int(p["max_draft_len"]), route_threshold=int(p["route_threshold"]),
            use_draft_logits=as_bool(p.get("use_draft_logits")))
        self.max_seq_len = int(p["max_seq_len"])
        self.exclude_default = as_bool(p.get("exclude_input_in_output"))
        self.context = int(p.get("stream_context_tokens") or 32)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))
        # Each in-flight engine call parks one thread while it waits: size the pool for many concurrent requests.
        self.executor = ThreadPoolExecutor(max_workers=256, thread_name_prefix="trtspec-bls")
        self.engines = BlsEngines(self.executor)

    async def execute(self, requests):
        loop = asyncio.get_running_loop()
        loop.set_default_executor(self.executor)  # async_exec runs its blocking part on the default executor
        if self.decoupled:
            await asyncio.gather(*[self._serve(r, r.get_response_sender()) for r in requests])
            return None
        return await asyncio.gather(*[self._serve(r, None) for r in requests])

    def _parse(self, x):
        ids = x["input_ids"]
        batch = ids.shape[0]
        lengths = scalar_rows(x.get("input_lengths"), batch, ids.shape[1])
        out_len = scalar_rows(x.get("request_output_len"), batch, 0)
        end_id = scalar_rows(x.get("end_id"), batch, -1)
        pad_id = scalar_rows(x.get("pad_id"), batch, 0)
        temp = scalar_rows(x.get("temperature"), batch, 0.0)
        top_k = scalar_rows(x.get("runtime_top_k"), batch, 0)
        top_p = scalar_rows(x.get("runtime_top_p"), batch, 1.0)
        seed = scalar_rows(x.get("seed"), batch, None)
        k = scalar_rows(x.get("num_draft_tokens"), batch, self.deployment.max_draft_len)
        use_logits = scalar_rows(x.get("use_draft_logits"), batch, self.deployment.use_draft_logits)
        stream = scalar_rows(x.get("streaming"), batch, False)
        exclude = scalar_rows(x.get("exclude_input_in_output"), batch, self.exclude_default)
        rows = []
        for b in range(batch):
            prompt = ids[b, : int(lengths[b])].tolist()
            n = int(out_len[b])
            if not prompt:
                raise GenerationError("the prompt is empty", hint="send at least one token")
            if n <= 0:
                raise GenerationError(f"max_tokens must be > 0, got {n}", hint="ask for at least one token")
            if len(prompt) + n > self.max_seq_len:
                raise GenerationError(f"prompt ({len(prompt)} tokens) + max_tokens ({n}) exceeds max_seq_len "
                                      f"({self.max_seq_len})", hint="lower max_tokens")
            if not 0 <= int(k[b]) <= MAX_DRAFT_LEN:
                raise GenerationError(f"num_draft_tokens must be in 0..{MAX_DRAFT_LEN}, got {int(k[b])}",
                                      hint="0 disables the draft")
            t, tk = float(temp[b]), int(top_k[b])
            greedy = t <= 0.0 or tk == 1
            params = StepParams(
                end_id=None if int(end_id[b]) < 0 else int(end_id[b]), pad_id=int(pad_id[b]),
                temperature=0.0 if greedy else t, top_k=0 if greedy else tk,
                top_p=float(top_p[b]) if not greedy and 0 < float(top_p[b]) <= 1 else 1.0,
                seed=None if seed[b] is None else int(seed[b]),
                stop_words=decode_word_list(x["stop_words_list"][b]) if "stop_words_list" in x else [],
                bad_words=decode_word_list(x["bad_words_list"][b]) if "bad_words_list" in x else [])
            rows.append(GenRequest(prompt, n, params, num_draft_tokens=int(k[b]),
                                   use_draft_logits=bool(use_logits[b]), stream=bool(stream[b])))
        return rows, [bool(e) for e in exclude]

    async def _serve(self, request, sender):
        try:
            rows, exclude = self._parse(request_inputs(request))
            streaming = any(r.stream for r in rows)
            if streaming and sender is None:
                raise GenerationError("streaming needs the decoupled transaction policy",
                                      hint="set triton.decoupled: true in the spec and rewrite the repository")
            state = _Rows([r.prompt for r in rows], self.context)

            async def run(b):
                async for tokens in generate(rows[b], self.engines, self.deployment, state.stats[b]):
                    state.out[b] += tokens
                    if streaming:
                        sender.send(pb_utils.InferenceResponse(output_tensors=state.tensors(True, exclude, False)))

            await asyncio.gather(*[run(b) for b in range(len(rows))])
            response = pb_utils.InferenceResponse(output_tensors=state.tensors(streaming, exclude, True))
        except Exception as exc:  # noqa: BLE001 - an error response; the model keeps serving
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(error_message(exc)))
        if sender is None:
            return response
        sender.send(response, flags=FINAL)
        return None
