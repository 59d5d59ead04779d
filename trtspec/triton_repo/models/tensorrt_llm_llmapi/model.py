"""trtspec's `tensorrt_llm` model for runtime trtllm-llmapi: TensorRT-LLM's LLM API (PyTorch backend) with draft-target
speculative decoding, configured by ``model.yaml`` next to this file (written by trtspec.trtllm.llmapi).

The tensor contract is the one of TensorRT-LLM's own llmapi model (triton_backend/all_models/llmapi/tensorrt_llm):
``text_input``, ``streaming`` and ``sampling_param_*`` in; ``text_output``, ``finish_reason`` and the draft acceptance
statistics out. ``model.yaml`` holds the ``LLM(**args)`` arguments (``speculative_config`` among them) and a
``triton_config`` section, which Triton's settings in config.pbtxt were written from. tensorrt_llm is imported in
initialize(): this model only loads where TensorRT-LLM is installed (the NGC trtllm image).

Acceptance statistics come from ``request_perf_metrics.speculative_decoding``. The PyTorch flow leaves that section
zeroed in every release up to 1.2 (TensorRT-LLM PR #17082 fixed it later), so a response whose section shows no draft
tokens carries no acceptance outputs at all: unavailable, never reported as an acceptance of 0.

Decoupled (``triton_config.decoupled``): each request runs on its own thread and streams one response per step when
``streaming`` is true; the model's control watcher (trtspec.triton_repo.control: ``request.is_cancelled()`` every
100 ms, as upstream's llmapi model polls) answers a cancelled request CANCELLED and aborts its LLM API request
(``RequestOutput.abort()``), and the same control refuses new requests while the server drains. Every response goes
through the control's per-request lock, so no request is asked ``is_cancelled()`` after its final response: asked
then, Triton 2.51's server process dereferences the freed response factory and dies (SIGSEGV, seen in this model's
own watch thread before). Otherwise execute() submits every request of the batch before waiting for any, so the LLM
API batches them in flight.
"""

import os
import sys

# The Python backend stub ignores PYTHONPATH: the server passes extra import paths in TRTSPEC_PYTHONPATH.
for _path in reversed(os.environ.get("TRTSPEC_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

from trtspec.triton_repo.control import ModelControl

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# request input -> (SamplingParams field, type)
SAMPLING_INPUTS = {
    "sampling_param_temperature": ("temperature", float),
    "sampling_param_top_k": ("top_k", int),
    "sampling_param_top_p": ("top_p", float),
    "sampling_param_max_tokens": ("max_tokens", int),
    "sampling_param_seed": ("seed", int),
}


def _scalar(request, name, default=None):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy()
    if array.size != 1:
        raise ValueError(f"input {name} must hold one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0]


def _strings(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


def load_llm_config(path):
    """(LLM arguments, triton_config) from model.yaml."""
    with open(path, encoding="utf-8") as f:
        config = yaml.safe_load(f) or {}
    triton = config.pop("triton_config", {}) or {}
    return config, triton


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.model_config)
        params = self.model_config.get("parameters", {})
        name = params.get("llm_config", {}).get("string_value", "model.yaml")
        path = os.path.join(args["model_repository"], args["model_version"], name)
        llm_args, _ = load_llm_config(path)

        from tensorrt_llm import LLM, SamplingParams
        from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict

        self._sampling_cls = SamplingParams
        # update_llm_args_with_extra_dict turns nested sections (speculative_config, kv_cache_config ...) into the
        # LLM API's config objects, as `trtllm-serve --extra_llm_api_options` does.
        self.llm = LLM(**update_llm_args_with_extra_dict({}, llm_args))
        self._threads = set()
        self._lock = threading.Lock()
        # Cancellation (100 ms polls: upstream's cancellation_check_period_ms default) and drain.
        self.control = ModelControl(pb_utils, args["model_name"])

    # -- requests ------------------------------------------------------------------------------------------------
    def _parse(self, request):
        texts = _strings(request, "text_input")
        if len(texts) != 1:
            raise ValueError(f"text_input must hold one prompt, got {len(texts)}")
        kwargs = {}
        for name, (field, cast) in SAMPLING_INPUTS.items():
            value = _scalar(request, name)
            if value is not None:
                kwargs[field] = cast(value)
        stop = _strings(request, "sampling_param_stop")
        if stop:
            kwargs["stop"] = stop
        if bool(_scalar(request, "sampling_param_return_perf_metrics", True)):
            kwargs["return_perf_metrics"] = True  # what the acceptance statistics are read from
        try:
            sampling = self._sampling_cls(**kwargs)
        except TypeError:  # releases whose SamplingParams has no return_perf_metrics
            kwargs.pop("return_perf_metrics", None)
            sampling = self._sampling_cls(**kwargs)
        stream = bool(_scalar(request, "streaming", False))
        echo = not bool(_scalar(request, "sampling_param_exclude_input_from_output", True))
        prompt = texts[0]
        if bool(_scalar(request, "apply_chat_template", False)):
            prompt = self._chat(prompt)
        return prompt, sampling, stream, echo

    def _chat(self, text):
        """The target tokenizer's chat template around one user turn (the raw text when it has none)."""
        # LLM.tokenizer is TensorRT-LLM's TransformersTokenizer, which wraps the HF tokenizer as .tokenizer
        tok = getattr(self.llm.tokenizer, "tokenizer", self.llm.tokenizer)
        if not getattr(tok, "chat_template", None):
            return text
        return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)

    @staticmethod
    def _tensors(text, reason="", acceptance=None, generated=0):
        tensors = [
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("finish_reason", np.array([reason.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("num_output_tokens", np.array([generated], dtype=np.int32)),
        ]
        if acceptance is not None:
            rate, accepted, drafted = acceptance
            tensors += [
                pb_utils.Tensor("acceptance_rate", np.array([rate], dtype=np.float32)),
                pb_utils.Tensor("total_accepted_draft_tokens", np.array([accepted], dtype=np.int32)),
                pb_utils.Tensor("total_draft_tokens", np.array([drafted], dtype=np.int32)),
            ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    @staticmethod
    def acceptance(out):
        """(acceptance rate, accepted, drafted) from the speculative-decoding perf section, or None when it reports no
        draft tokens: zeroed by the PyTorch flow (see the module docstring), or nothing was drafted yet."""
        spec = getattr(getattr(out, "request_perf_metrics", None), "speculative_decoding", None)
        drafted = int(getattr(spec, "total_draft_tokens", 0) or 0)
        if spec is None or drafted <= 0:
            return None
        accepted = int(getattr(spec, "total_accepted_draft_tokens", 0) or 0)
        rate = getattr(spec, "acceptance_rate", None)
        return float(rate) if rate is not None else accepted / drafted, accepted, drafted

    def _response(self, result, text):
        out = result.outputs[0]
        reason = str(out.finish_reason) if getattr(out, "finish_reason", None) is not None else ""
        return self._tensors(text, reason, self.acceptance(out), len(out.token_ids or []))

    @staticmethod
    def _error(exc):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{type(exc).__name__}: {exc}"))

    def execute(self, requests):
        if not self.decoupled:
            pending = []
            tracked = [self.control.admit(r, decoupled=False) for r in requests]
            for request, t in zip(requests, tracked):  # submit all first: the LLM API batches them in flight
                if t.closed:  # refused while draining
                    pending.append((t.response, ""))
                    continue
                try:
                    prompt, sampling, _, echo = self._parse(request)
                    pending.append((self.llm.generate_async(prompt, sampling), prompt if echo else ""))
                except Exception as exc:  # noqa: BLE001 - answered as this request's error
                    pending.append((exc, ""))
            responses = []
            for (result, prefix), t in zip(pending, tracked):
                if isinstance(result, pb_utils.InferenceResponse):
                    responses.append(result)
                    continue
                if isinstance(result, Exception):
                    response = self._error(result)
                else:
                    try:
                        result.result()
                        response = self._response(result, prefix + result.outputs[0].text)
                    except Exception as exc:  # noqa: BLE001
                        response = self._error(exc)
                t.send(response, flags=FINAL)  # closes it: the watcher no longer asks about it
                responses.append(response)
            return responses
        for request in requests:
            thread = threading.Thread(target=self._serve_decoupled, args=(request,), daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()
        return None

    def _serve_decoupled(self, request):
        sender = self.control.admit(request)  # its send() drops what is due once the request is closed
        try:
            if sender.closed:
                return  # refused while draining (answered)
            prompt, sampling, stream, echo = self._parse(request)
            result = self.llm.generate_async(prompt, sampling, streaming=stream)
            sender.on_cancel = result.abort  # cancelled (answered CANCELLED by the watcher) or cut at a drain
            if stream:
                sent = False
                if echo:
                    sender.send(self._tensors(prompt))
                for step in result:  # one RequestOutput per step; text_diff is what this step added
                    if sender.cancelled:
                        break  # aborted: the client is gone
                    final = bool(step.finished)
                    sender.send(self._response(step, step.outputs[0].text_diff), flags=FINAL if final else 0)
                    sent = final
                if not sent:
                    sender.send(flags=FINAL)  # nothing, once the watcher has answered
            else:
                result.result()
                sender.send(self._response(result, (prompt if echo else "") + result.outputs[0].text), flags=FINAL)
        except Exception as exc:  # noqa: BLE001 - the client gets the error, the model keeps serving
            sender.send(self._error(exc), flags=FINAL)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def finalize(self):
        self.control.close()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=30)
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()
