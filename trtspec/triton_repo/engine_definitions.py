"""The engine-backed `tensorrt_llm` (target) and `tensorrt_llm_draft` models for runtime trtllm-engine.

Built by ``pbtxt.new_config`` like every other model, never from text templates. The tensors
(``tensors.BACKEND_INPUTS``/``BACKEND_OUTPUTS``) and parameter keys follow TensorRT-LLM's
triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt; every ``${...}`` of that template that the
backend needs gets a value here, the optional ones are left out (the backend then uses its default) instead of being
left as placeholders. Draft-target settings follow
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

from trtspec.build.layout import served_roles
from trtspec.errors import SpecError
from trtspec.spec import BuildSpec, DType
from trtspec.triton_repo.names import ROLE_MODELS
from trtspec.triton_repo.pbtxt import Batching, new_config
from trtspec.triton_repo.tensors import BACKEND_INPUTS, BACKEND_OUTPUTS, with_dtypes
from trtspec.trtllm.container import engine_path_in_container
from trtspec.trtllm.trtllm_build import engine_input_limits

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2

    from trtspec.build.memory import MemoryPlan

LOGITS_DATATYPE = "FP32"  # trtllm_build.LOGITS_DTYPE: both engines are built with float32 logits
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
# Multi-model (orchestrator) mode: one Triton process drives both engines' executors (trtspec.serving.launch sets the
# rest of upstream's launch: spawning on or off, mpirun ranks).
SERVER_ENV = {"TRTLLM_ORCHESTRATOR": "1"}
# Read by the backend with GetParameter and no fallback: a missing key fails the model instance. Empty strings turn
# guided decoding off (the C++ workflow ignores tokenizer_dir's value).
GUIDED_DECODING_PARAMETERS = {"tokenizer_dir": "", "xgrammar_tokenizer_info_path": "", "guided_decoding_backend": ""}

INT32_MAX = 2**31 - 1
_DTYPE_TYPES = {DType.FLOAT16: "FP16", DType.BFLOAT16: "BF16", DType.FLOAT32: "FP32"}


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
    model = getattr(spec, role)
    mbs = spec.engine.max_batch_size
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
        **engine_input_limits(spec).config_parameters,  # every step re-sends the sequence: it must fit the cap
    }
    if kv_fraction is not None:  # an explicit cap from the spec; the backend uses the smaller of the two
        params["kv_cache_free_gpu_mem_fraction"] = f"{kv_fraction:.4f}"
    if layout.fast_logits:
        params["speculative_decoding_fast_logits"] = "1"
        params["participant_ids"] = _ids(layout.participant_ids[role])
    return new_config(
        ROLE_MODELS[role],
        backend="tensorrtllm",
        max_batch_size=mbs,
        decoupled=decoupled,
        # The backend places the engine on gpu_device_ids itself; Triton's instance is a CPU-side handle.
        instances=1,
        parameters=params,
        inputs=with_dtypes(BACKEND_INPUTS, _DTYPE_TYPES[model.dtype], LOGITS_DATATYPE),
        outputs=with_dtypes(BACKEND_OUTPUTS, _DTYPE_TYPES[model.dtype], LOGITS_DATATYPE),
        # A bounded queue: beyond it requests are rejected at once rather than waiting, and the HPA (docker/k8s)
        # scales on the queue instead.
        batching=Batching(spec.triton.max_queue_delay_us, preferred=(mbs,), max_queue_size=max(64, 8 * mbs)),
    )


def engine_model_configs(
    spec: BuildSpec, plan: MemoryPlan | None = None, decoupled: bool = False
) -> dict[str, model_config_pb2.ModelConfig]:
    """The engine-backed models (both, unless drafter ngram), keyed by Triton model name. Both KV caches hold the same
    sequences, so each gets the memory plan's token capacity (target + draft bytes per token fit on GPU 0)."""
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
        ROLE_MODELS[r]: engine_model_config(
            spec, r, kv_tokens=tokens, kv_fraction=caps[r], layout=layout, decoupled=decoupled
        )
        for r in served_roles(spec)
    }
