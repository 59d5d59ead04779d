"""Request translation for a served repository, shared by every client (``trtspec generate --url``, ``trtspec bench``,
the OpenAI-compatible frontend).

Two contracts: the ``ensemble`` (TensorRT-LLM's ensemble inputs, batched ``[1, ...]``) and, for runtime
trtllm-llmapi, the one ``tensorrt_llm`` model with TensorRT-LLM's llmapi inputs (``sampling_param_*``, no batch
dimension). Requests are written once in ensemble field names; ``translate`` maps them to the model's contract.
"""

from __future__ import annotations

from typing import Any

from trtspec.errors import GenerationError
from trtspec.request_fields import NUMPY_TYPES, SAMPLING_FIELDS

CONTRACTS = ("ensemble", "llmapi")
STAT_NAMES = (
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "num_input_tokens",
    "num_output_tokens",
)
# ensemble field -> llmapi model input (trtspec.triton_repo.tensors.LLMAPI_INPUTS)
LLMAPI_FIELDS = {
    "text_input": "text_input",
    "max_tokens": "sampling_param_max_tokens",
    "stream": "streaming",
    **{f.name: f.llmapi for f in SAMPLING_FIELDS if f.llmapi},  # trtspec.request_fields
    "exclude_input_in_output": "sampling_param_exclude_input_from_output",
    "stop_words": "sampling_param_stop",
    "return_perf_metrics": "sampling_param_return_perf_metrics",
    "apply_chat_template": "apply_chat_template",
}
LLMAPI_STATS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "num_output_tokens")


def input_types(contract: str = "ensemble") -> dict[str, str]:
    """Input name -> Triton data type of the contract's entry model."""
    from trtspec.triton_repo.tensors import ENSEMBLE_INPUTS, LLMAPI_INPUTS

    return {t.name: t.dtype for t in (LLMAPI_INPUTS if contract == "llmapi" else ENSEMBLE_INPUTS)}


def stat_names(contract: str) -> tuple[str, ...]:
    """The statistics outputs the contract's entry model has (TensorRT-LLM's names)."""
    return LLMAPI_STATS if contract == "llmapi" else STAT_NAMES


def contract_of(inputs: set[str] | None) -> str | None:
    """The contract a model with these input names speaks (None: no such model)."""
    if inputs is None:
        return None
    return "llmapi" if "sampling_param_max_tokens" in inputs else "ensemble"


def request_inputs(prompt: str | bytes, max_tokens: int, stream: bool, options: dict[str, Any]) -> dict[str, Any]:
    """The ensemble inputs for one request (None-valued options are left out)."""
    values: dict[str, Any] = {
        "text_input": prompt,
        "max_tokens": int(max_tokens),
        "stream": bool(stream),
        "exclude_input_in_output": True,
    }
    values.update({k: v for k, v in options.items() if v is not None})
    known = input_types()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise GenerationError(f"unknown request field {unknown[0]!r}", hint=f"known: {', '.join(sorted(known))}")
    from trtspec.validation import validate_fields

    validate_fields(values)  # the rules every path applies, before anything is sent
    return values


def llmapi_inputs(values: dict[str, Any]) -> dict[str, Any]:
    """Ensemble request fields as the llmapi model's inputs; a field it has no input for is an error."""
    unsupported = sorted(set(values) - set(LLMAPI_FIELDS))
    if unsupported == ["num_draft_tokens"] and values["num_draft_tokens"] == 0:
        raise GenerationError(
            "the trtllm-llmapi model cannot skip the draft per request (num_draft_tokens 0)",
            hint="the LLM API applies the deployment's speculative_config to every request",
        )
    if unsupported:
        raise GenerationError(
            f"request field {unsupported[0]!r} is not supported by the trtllm-llmapi model",
            hint=f"supported: {', '.join(sorted(LLMAPI_FIELDS))}",
        )
    return {LLMAPI_FIELDS[k]: v for k, v in values.items()}


def translate(values: dict[str, Any], contract: str) -> dict[str, Any]:
    """Ensemble request fields as the inputs of ``contract``'s entry model."""
    return llmapi_inputs(values) if contract == "llmapi" else values


def grpc_inputs(values: dict[str, Any], contract: str) -> list[Any]:
    """``tritonclient.grpc.InferInput`` tensors for translated ``values`` (used by the sync and asyncio clients)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    types = input_types(contract)
    inputs = []
    for name, value in values.items():
        dtype = types[name]
        if dtype == "STRING":
            items = value if isinstance(value, (list, tuple)) else [value]
            arr = np.array([v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in items], dtype=np.object_)
            dtype = "BYTES"
        else:
            items = value if isinstance(value, (list, tuple)) else [value]  # a list for a [-1] input, scalars in [1]
            arr = np.array(items, dtype=getattr(np, NUMPY_TYPES[dtype]))
        if contract != "llmapi":
            arr = arr[None]  # the ensemble batches: [1, ...]
        x = grpcclient.InferInput(name, list(arr.shape), dtype)
        x.set_data_from_numpy(arr)
        inputs.append(x)
    return inputs


def grpc_outputs(contract: str) -> list[Any]:
    """The outputs to request: the text and the contract's statistics."""
    import tritonclient.grpc as grpcclient

    return [grpcclient.InferRequestedOutput(n) for n in ("text_output", *stat_names(contract))]


def result_payload(result: Any, contract: str) -> tuple[str, dict[str, float]] | None:
    """(text, statistics) of one gRPC response; None for a response without ``text_output`` (an empty final one)."""
    text_out = result.as_numpy("text_output")
    if text_out is None:
        return None
    text = b"".join(bytes(t) for t in text_out.reshape(-1)).decode("utf-8", errors="replace")
    stats: dict[str, float] = {}
    for n in stat_names(contract):
        v = result.as_numpy(n)
        if v is not None:
            stats[n] = float(v.reshape(-1)[0]) if n == "acceptance_rate" else int(v.reshape(-1)[0])
    return text, stats


def json_payload(data: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """(text, statistics) of one HTTP generate / generate_stream response body."""
    if "error" in data:
        raise GenerationError(f"server: {data['error']}", hint="the server refused this request; its log has details")
    text = data.get("text_output", "")
    if isinstance(text, list):
        text = "".join(text)
    stats: dict[str, float] = {}
    for n in STAT_NAMES:
        if n in data:
            v = data[n][0] if isinstance(data[n], list) else data[n]
            stats[n] = float(v) if n == "acceptance_rate" else int(v)
    return text, stats
