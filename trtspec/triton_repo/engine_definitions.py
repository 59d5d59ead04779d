"""The engine-backed `tensorrt_llm` (target) and `tensorrt_llm_draft` models for runtime trtllm-engine.

Built as ``tritonclient.grpc.model_config_pb2.ModelConfig`` objects, never from text templates. The tensors and
parameter keys follow TensorRT-LLM's triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt; every
``${...}`` of that template that the backend needs gets a value here, the optional ones are left out (the backend
then uses its default) instead of being left as placeholders. Draft-target settings follow
examples/draft_target_model/README.md: both models in one server in orchestrator (multi-model) mode, KV-cache reuse
on, each engine's KV cache sized in absolute tokens (``max_tokens_in_paged_kv_cache``) so that the load order of the two
models does not matter; fast logits (``speculative_decoding_fast_logits`` with MPI ``participant_ids``) when the target
is tensor-parallel. Every parameter the backend reads without a fallback (model_instance_state.cc: ``gpt_model_type``,
``tokenizer_dir``, ``xgrammar_tokenizer_info_path``, ``guided_decoding_backend``) is written, and every output the
backend writes unasked (the perf metrics of ``return_perf_metrics``) is declared. The upstream facts are recorded in
tests/upstream/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtspec.engines.container import engine_path_in_container
from trtspec.errors import SpecError
from trtspec.spec import BuildSpec, DType

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2

    from trtspec.build.memory import MemoryPlan

MODEL_NAMES = {"target": "tensorrt_llm", "draft": "tensorrt_llm_draft"}
LOGITS_DATATYPE = "TYPE_FP32"  # trtllm_build.LOGITS_DTYPE: both engines are built with float32 logits
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
# Multi-model (orchestrator) mode: one Triton process drives both engines' executors (trtspec.serving.launch sets the
# rest of upstream's launch: spawning on or off, mpirun ranks).
SERVER_ENV = {"TRTLLM_ORCHESTRATOR": "1"}
# Read by the backend with GetParameter and no fallback: a missing key fails the model instance. Empty strings turn
# guided decoding off (the C++ workflow ignores tokenizer_dir's value).
GUIDED_DECODING_PARAMETERS = {"tokenizer_dir": "", "xgrammar_tokenizer_info_path": "", "guided_decoding_backend": ""}

INT32_MAX = 2**31 - 1
_DTYPE_TYPES = {DType.FLOAT16: "TYPE_FP16", DType.BFLOAT16: "TYPE_BF16", DType.FLOAT32: "TYPE_FP32"}
_SCALAR = "scalar"  # dims [1] reshaped to []

# (name, data_type, dims, optional, ragged); data_type "${dtype}" / "${logits}" are filled per model.
_INPUTS: tuple[tuple[str, str, tuple[int, ...] | str, bool, bool], ...] = (
    ("input_ids", "TYPE_INT32", (-1,), True, True),
    ("encoder_input_features", "${dtype}", (-1, -1), True, True),
    ("encoder_output_lengths", "TYPE_INT32", _SCALAR, True, False),
    ("input_lengths", "TYPE_INT32", _SCALAR, False, False),
    ("request_output_len", "TYPE_INT32", _SCALAR, False, False),
    ("num_return_sequences", "TYPE_INT32", _SCALAR, True, False),
    ("draft_input_ids", "TYPE_INT32", (-1,), True, True),
    ("decoder_input_ids", "TYPE_INT32", (-1,), True, True),
    ("decoder_input_lengths", "TYPE_INT32", _SCALAR, True, False),
    ("draft_logits", "${logits}", (-1, -1), True, True),
    ("draft_acceptance_threshold", "TYPE_FP32", _SCALAR, True, False),
    ("end_id", "TYPE_INT32", _SCALAR, True, False),
    ("pad_id", "TYPE_INT32", _SCALAR, True, False),
    ("stop_words_list", "TYPE_INT32", (2, -1), True, True),
    ("bad_words_list", "TYPE_INT32", (2, -1), True, True),
    ("embedding_bias", "TYPE_FP32", (-1,), True, True),
    ("beam_width", "TYPE_INT32", _SCALAR, True, False),
    ("temperature", "TYPE_FP32", _SCALAR, True, False),
    ("runtime_top_k", "TYPE_INT32", _SCALAR, True, False),
    ("runtime_top_p", "TYPE_FP32", _SCALAR, True, False),
    ("runtime_top_p_min", "TYPE_FP32", _SCALAR, True, False),
    ("runtime_top_p_decay", "TYPE_FP32", _SCALAR, True, False),
    ("runtime_top_p_reset_ids", "TYPE_INT32", _SCALAR, True, False),
    ("len_penalty", "TYPE_FP32", _SCALAR, True, False),
    ("early_stopping", "TYPE_BOOL", _SCALAR, True, False),
    ("repetition_penalty", "TYPE_FP32", _SCALAR, True, False),
    ("min_tokens", "TYPE_INT32", _SCALAR, True, False),
    ("beam_search_diversity_rate", "TYPE_FP32", _SCALAR, True, False),
    ("presence_penalty", "TYPE_FP32", _SCALAR, True, False),
    ("frequency_penalty", "TYPE_FP32", _SCALAR, True, False),
    ("seed", "TYPE_UINT64", _SCALAR, True, False),
    ("return_log_probs", "TYPE_BOOL", _SCALAR, True, False),
    ("return_context_logits", "TYPE_BOOL", _SCALAR, True, False),
    ("return_generation_logits", "TYPE_BOOL", _SCALAR, True, False),
    ("return_perf_metrics", "TYPE_BOOL", _SCALAR, True, False),
    ("return_num_input_tokens", "TYPE_BOOL", _SCALAR, True, False),
    ("return_num_output_tokens", "TYPE_BOOL", _SCALAR, True, False),
    ("exclude_input_in_output", "TYPE_BOOL", _SCALAR, True, False),
    ("stop", "TYPE_BOOL", _SCALAR, True, False),
    ("streaming", "TYPE_BOOL", _SCALAR, True, False),
    ("prompt_embedding_table", "${dtype}", (-1, -1), True, True),
    ("prompt_table_extra_ids", "TYPE_UINT64", (-1,), True, True),
    ("prompt_vocab_size", "TYPE_INT32", _SCALAR, True, False),
    ("lora_task_id", "TYPE_UINT64", _SCALAR, True, False),
    ("lora_weights", "TYPE_FP16", (-1, -1), True, True),
    ("lora_config", "TYPE_INT32", (-1, 3), True, True),
)

_OUTPUTS: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("output_ids", "TYPE_INT32", (-1, -1)),
    ("sequence_length", "TYPE_INT32", (-1,)),
    ("cum_log_probs", "TYPE_FP32", (-1,)),
    ("output_log_probs", "TYPE_FP32", (-1, -1)),
    ("context_logits", "${logits}", (-1, -1)),
    ("generation_logits", "${logits}", (-1, -1, -1)),
    ("batch_index", "TYPE_INT32", (1,)),
    ("sequence_index", "TYPE_INT32", (1,)),
    ("context_phase_params", "TYPE_UINT8", (-1,)),
    # Written into every response of a request with return_perf_metrics, asked for or not: undeclared, Triton fails the
    # response ("unexpected inference output").
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    ("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    ("arrival_time_ns", "TYPE_INT64", (1,)),
    ("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    ("first_token_time_ns", "TYPE_INT64", (1,)),
    ("last_token_time_ns", "TYPE_INT64", (1,)),
    ("acceptance_rate", "TYPE_FP32", (1,)),
    ("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    ("total_draft_tokens", "TYPE_INT32", (1,)),
    # return_num_input_tokens / return_num_output_tokens
    ("num_input_tokens", "TYPE_INT32", (1,)),
    ("num_output_tokens", "TYPE_INT32", (1,)),
)


@dataclass(frozen=True)
class ServingLayout:
    """Which GPUs and MPI ranks each engine uses, and the world size the server must be launched with."""

    fast_logits: bool
    world_size: int  # MPI world for `--multi-model --disable-spawn-processes`; 1 when the backend spawns workers
    gpu_device_ids: dict[str, tuple[int, ...]]
    participant_ids: dict[str, tuple[int, ...]]  # empty without fast logits


def serving_layout(spec: BuildSpec) -> ServingLayout:
    """Target shards on GPUs 0..tp-1, the draft on GPU 0 beside the first shard (as the memory plan assumes)."""
    tp_t, tp_d = spec.target.tp_size, spec.draft.tp_size
    gpus = {"target": tuple(range(tp_t)), "draft": tuple(range(tp_d))}
    if tp_t == 1:
        return ServingLayout(False, 1, gpus, {})
    # Fast logits: rank 0 is the orchestrator, then the draft's ranks, then the target's (world = 1 + tp_d + tp_t).
    draft_ranks = tuple(range(1, 1 + tp_d))
    target_ranks = tuple(range(1 + tp_d, 1 + tp_d + tp_t))
    return ServingLayout(True, 1 + tp_d + tp_t, gpus, {"draft": draft_ranks, "target": target_ranks})


def _memory_plan(spec: BuildSpec) -> MemoryPlan:
    from trtspec.build.memory import plan_memory
    from trtspec.families import read_config

    return plan_memory(spec, read_config(spec.model_path("target")), read_config(spec.model_path("draft")))


def _ids(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def engine_model_config(
    spec: BuildSpec,
    role: str,
    *,
    kv_tokens: int,
    layout: ServingLayout,
    kv_fraction: float | None = None,
    decoupled: bool = False,
) -> model_config_pb2.ModelConfig:
    """One engine-backed model (`tensorrt_llm` for the target, `tensorrt_llm_draft` for the draft)."""
    from tritonclient.grpc import model_config_pb2 as pb

    model = getattr(spec, role)
    fill = {"${dtype}": _DTYPE_TYPES[model.dtype], "${logits}": LOGITS_DATATYPE}
    mbs = spec.engine.max_batch_size
    cfg = pb.ModelConfig(name=MODEL_NAMES[role], backend="tensorrtllm", max_batch_size=mbs)
    cfg.model_transaction_policy.decoupled = decoupled
    cfg.dynamic_batching.preferred_batch_size.append(mbs)
    cfg.dynamic_batching.max_queue_delay_microseconds = spec.triton.max_queue_delay_us
    # A bounded queue: beyond it requests are rejected at once rather than waiting, and the HPA (docker/k8s)
    # scales on the queue instead.
    cfg.dynamic_batching.default_queue_policy.max_queue_size = max(64, 8 * mbs)
    for name, dtype, dims, optional, ragged in _INPUTS:
        inp = cfg.input.add(
            name=name, data_type=pb.DataType.Value(fill.get(dtype, dtype)), optional=optional, allow_ragged_batch=ragged
        )
        if dims == _SCALAR:
            inp.dims.append(1)
            inp.reshape.SetInParent()  # reshape: { shape: [ ] }
        else:
            inp.dims.extend(dims)
    for name, dtype, dims in _OUTPUTS:
        cfg.output.add(name=name, data_type=pb.DataType.Value(fill.get(dtype, dtype)), dims=dims)
    # The backend places the engine on gpu_device_ids itself; Triton's instance is a CPU-side handle.
    cfg.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)
    params = {
        "max_beam_width": "1",
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_path_in_container(role),
        "batch_scheduler_policy": "guaranteed_no_evict",
        # Absolute tokens: each executor would otherwise take a fraction of whatever is free when it allocates, and
        # Triton loads the two models in no fixed order.
        "max_tokens_in_paged_kv_cache": str(kv_tokens),
        "enable_kv_cache_reuse": "true",  # draft-target reuses the prefix every step
        "exclude_input_in_output": "true",
        "gpu_device_ids": _ids(layout.gpu_device_ids[role]),
        "executor_worker_path": EXECUTOR_WORKER,
        **GUIDED_DECODING_PARAMETERS,
    }
    if kv_fraction is not None:  # an explicit cap from the spec; the backend uses the smaller of the two
        params["kv_cache_free_gpu_mem_fraction"] = f"{kv_fraction:.4f}"
    if layout.fast_logits:
        params["speculative_decoding_fast_logits"] = "1"
        params["participant_ids"] = _ids(layout.participant_ids[role])
    for key, value in params.items():
        cfg.parameters[key].string_value = value
    return cfg


def engine_model_configs(
    spec: BuildSpec, plan: MemoryPlan | None = None, decoupled: bool = False
) -> dict[str, model_config_pb2.ModelConfig]:
    """Both engine-backed models, keyed by Triton model name. Both KV caches hold the same sequences, so each gets the
    memory plan's token capacity (target + draft bytes per token fit on GPU 0)."""
    plan = plan or _memory_plan(spec)
    if plan.kv_tokens_capacity <= 0:
        raise SpecError(
            "the target and draft leave no GPU memory for KV cache",
            hint="run `trtspec check`; use a smaller quantization format, more GPUs (target.tp_size) or "
            "a larger gpu.memory_gib",
        )
    tokens = min(plan.kv_tokens_capacity, INT32_MAX)  # the backend parses it with std::stoi
    layout = serving_layout(spec)
    caps = {"target": spec.triton.target_kv_cache_fraction, "draft": spec.triton.draft_kv_cache_fraction}
    return {
        MODEL_NAMES[r]: engine_model_config(
            spec, r, kv_tokens=tokens, kv_fraction=caps[r], layout=layout, decoupled=decoupled
        )
        for r in ("target", "draft")
    }


def config_text(cfg: model_config_pb2.ModelConfig) -> str:
    """config.pbtxt text (``max_batch_size: 0`` written explicitly, which text_format would omit)."""
    from google.protobuf import text_format

    text = text_format.MessageToString(cfg)
    if cfg.max_batch_size == 0:
        text = "max_batch_size: 0\n" + text
    return text
