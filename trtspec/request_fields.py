"""The per-request decoding fields, each declared once: its name at every door, its type, its default and its rule.

Everything else is derived from ``SAMPLING_FIELDS`` (and ``SPECULATION_FIELDS``: K and draft logits): the
ensemble's, the draft-target models' and the llmapi
model's input tables (trtspec.triton_repo.tensors), the ensemble's mapping onto its middle step
(trtspec.triton_repo.definitions), the parsing of those inputs in every model process
(trtspec.runtimes.inflight.contract), the engine tensors the orchestrator and the OpenAI frontend send
(``engine_tensors``), the llmapi translation (trtspec.serving.contract), the request rule
(trtspec.speculative.rules.validate_sampling, applied by trtspec.validation and the OpenAI API in the same words) and
``SamplingParams`` (whose attributes are the fields' names). A new field is one row here, its meaning in
``SamplingParams``/the acceptance routine, and its tests.

Names per level: ``name`` is the ensemble's input, the OpenAI request's field, the CLI's option (``--top-k``) and the
``SamplingParams`` attribute; ``engine`` is TensorRT-LLM's engine-model input (``runtime_top_k``), which the BLS
orchestrator and the in-process model take too; ``llmapi`` TensorRT-LLM's llmapi model input (None: not served by
runtime trtllm-llmapi, refused there by name). Upstream's names: ``tests/upstream/ensemble_inputs.json`` and
``tensorrt_llm_template.json`` (tensorrtllm_backend's config.pbtxt templates); tests/test_request_fields.py checks every
row against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RequestField:
    name: str  # ensemble input, OpenAI field, CLI option, SamplingParams attribute
    dtype: str  # Triton data type
    default: Any  # what an absent field means
    engine: str  # the engine models' input (tensorrt_llm, tensorrt_llm_draft, tensorrt_llm_bls)
    help: str
    llmapi: str | None = None  # the llmapi model's input; None: that runtime refuses the field by name
    history: bool = False  # depends on the tokens before each position (the BLS orchestration over TensorRT-LLM
    # engines refuses it: their penalty kernel counts the tokens before a step for every draft position in it)

    @property
    def numpy(self) -> str:
        return NUMPY_TYPES[self.dtype]


NUMPY_TYPES = {"INT32": "int32", "UINT64": "uint64", "FP32": "float32", "FP16": "float16", "BOOL": "bool_"}

SAMPLING_FIELDS: tuple[RequestField, ...] = (
    RequestField(
        "temperature", "FP32", 0.0, "temperature", "0 is greedy; > 0 samples", llmapi="sampling_param_temperature"
    ),
    RequestField("top_k", "INT32", 0, "runtime_top_k", "0 is off", llmapi="sampling_param_top_k"),
    RequestField("top_p", "FP32", 1.0, "runtime_top_p", "1.0 is off", llmapi="sampling_param_top_p"),
    RequestField("seed", "UINT64", None, "seed", "makes sampled output reproducible", llmapi="sampling_param_seed"),
    RequestField(
        "repetition_penalty",
        "FP32",
        1.0,
        "repetition_penalty",
        "> 1 discourages tokens of the prompt and the output so far (1.0 is off)",
        history=True,
    ),
    RequestField(
        "presence_penalty", "FP32", 0.0, "presence_penalty", "subtracted from seen tokens' logits (-2..2)", history=True
    ),
    RequestField(
        "frequency_penalty",
        "FP32",
        0.0,
        "frequency_penalty",
        "subtracted per occurrence from seen tokens' logits (-2..2)",
        history=True,
    ),
    RequestField(
        "min_tokens", "INT32", 0, "min_tokens", "nothing ends the sequence before this many tokens", history=True
    ),
)
# The speculation fields of a request (upstream: inputs of tensorrt_llm_bls; trtspec's ensemble has them too). None
# means the deployment's setting (its max_draft_len, its use_draft_logits).
SPECULATION_FIELDS: tuple[RequestField, ...] = (
    RequestField(
        "num_draft_tokens", "INT32", None, "num_draft_tokens", "K for this request: 0..max_draft_len, 0 = target only"
    ),
    RequestField("use_draft_logits", "BOOL", None, "use_draft_logits", "verify sampled drafts by their draft logits"),
)
REQUEST_FIELDS = SAMPLING_FIELDS + SPECULATION_FIELDS
BY_NAME = {f.name: f for f in REQUEST_FIELDS}


def sampling_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields present (not None) in ``values``, by field name."""
    return {f.name: values[f.name] for f in SAMPLING_FIELDS if values.get(f.name) is not None}


def engine_tensors(values: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """The draft-target and engine models' input tensors [1, 1] (name -> (array, Triton type)) for the request fields
    present in ``values`` (by field name)."""
    import numpy as np

    out = {}
    for f in REQUEST_FIELDS:
        v = values.get(f.name)
        if v is not None:
            out[f.engine] = (np.asarray([[v]], dtype=getattr(np, f.numpy)), f.dtype)
    return out
