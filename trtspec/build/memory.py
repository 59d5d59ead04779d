"""GPU memory plan: weight bytes per quantization format, KV-cache bytes per token, KV budget left per model.

The target may span ``tp_size`` GPUs; the draft always runs on GPU 0 beside the target's first shard, so GPU 0 is the
one that decides whether the pair fits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trtspec.build.formats import KVCacheFormat, Quantization
from trtspec.build.layout import ROLES, Role, runs
from trtspec.families import NormalizedConfig
from trtspec.spec import BuildSpec, DType, ModelSpec

GIB = 1024**3
# Runtime workspace per GPU (CUDA context, cuBLAS workspace, activations at max batch): a planning margin.
RUNTIME_RESERVE_BYTES = 2 * GIB

# Bytes per weight of decoder linear layers, including per-block scales. Embeddings, lm_head and norms stay in the
# model dtype (ModelOpt's default configs do not quantize them).
_LINEAR_BYTES: dict[Quantization, float | None] = {
    Quantization.NONE: None,  # dtype bytes
    Quantization.FP8: 1.0,
    Quantization.INT8_SQ: 1.0,
    Quantization.INT8_WO: 1.0,
    Quantization.INT4_AWQ: 0.5 + 2 / 128,  # int4 + one fp16 scale per 128-weight block
    Quantization.W4A8_AWQ: 0.5 + 2 / 128,
    Quantization.NVFP4: 0.5 + 1 / 16,  # fp4 + one fp8 scale per 16-weight block
}


def linear_bytes_per_weight(quantization: Quantization, dtype: DType) -> float:
    value = _LINEAR_BYTES[quantization]
    return float(dtype.nbytes) if value is None else value


def kv_bytes_per_element(kv_cache: KVCacheFormat, dtype: DType) -> int:
    return dtype.nbytes if kv_cache is KVCacheFormat.AUTO else 1


def weight_bytes(cfg: NormalizedConfig, model: ModelSpec) -> int:
    """Bytes of all weights of one model in its quantization format (all shards together)."""
    parts = cfg.param_counts()
    assert model.quantization is not None
    linear = parts["linear"] * linear_bytes_per_weight(model.quantization, model.dtype)
    other = (parts["embedding"] + parts["lm_head"] + parts["norm"]) * model.dtype.nbytes
    return int(linear + other)


def kv_bytes_per_token(cfg: NormalizedConfig, model: ModelSpec) -> int:
    """KV-cache bytes per token (all shards): layers x kv_heads x head_dim x 2 (K and V) x bytes."""
    return cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2 * kv_bytes_per_element(model.kv_cache, model.dtype)


@dataclass(frozen=True)
class ModelMemory:
    role: str
    params: int
    weight_bytes: int
    weight_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    tp_size: int


@dataclass(frozen=True)
class MemoryPlan:
    """How the pair fits on the GPUs; all figures in bytes unless named otherwise."""

    target: ModelMemory
    draft: ModelMemory
    gpu_bytes: int
    usable_bytes_per_gpu: int
    reserve_bytes: int
    free_for_kv_gpu0: int
    kv_tokens_capacity: int
    kv_tokens_needed: int
    target_kv_fraction: float
    draft_kv_fraction: float
    fits: bool
    kv_sufficient: bool

    def to_dict(self) -> dict:
        return asdict(self)


def _model_memory(role: str, cfg: NormalizedConfig, model: ModelSpec) -> ModelMemory:
    w = weight_bytes(cfg, model)
    kv = kv_bytes_per_token(cfg, model)
    tp = model.tp_size
    return ModelMemory(role, cfg.num_params, w, -(-w // tp), kv, -(-kv // tp), tp)


def plan_memory(spec: BuildSpec, target_cfg: NormalizedConfig, draft_cfg: NormalizedConfig) -> MemoryPlan:
    """Plan GPU 0 (target shard + draft) and report the KV budget each model gets there.

    Both caches hold the same sequences, so tokens of capacity cost target + draft KV bytes per token. The free
    memory left after weights is split between the two in proportion to their per-token KV bytes; the fractions
    are of the memory free at the time each model allocates its cache (target first, then draft), as TRT-LLM's
    ``kv_cache_free_gpu_mem_fraction`` means.
    """
    target = _model_memory("target", target_cfg, spec.target)
    draft = _model_memory("draft", draft_cfg, spec.draft)
    if not runs(spec, Role.DRAFT):  # drafter ngram: no draft model is loaded (build.layout.runs)
        draft = ModelMemory("draft", draft.params, 0, 0, 0, 0, draft.tp_size)
    gpu_bytes = int(spec.gpu.memory_gib * GIB)
    usable = int(gpu_bytes * spec.gpu.memory_utilization)
    free = usable - RUNTIME_RESERVE_BYTES - target.weight_bytes_per_gpu - draft.weight_bytes_per_gpu
    per_token = target.kv_bytes_per_token_per_gpu + draft.kv_bytes_per_token
    capacity = max(free, 0) // per_token if per_token else 0
    needed = spec.engine.max_batch_size * spec.engine.max_seq_len
    share_target = target.kv_bytes_per_token_per_gpu / per_token if per_token else 0.5
    # Fractions of the memory free when each model allocates: the target takes u*s_t of free memory F, the draft then
    # u*s_d*F out of the F*(1 - u*s_t) left, i.e. a fraction u*s_d / (1 - u*s_t).
    u = spec.gpu.memory_utilization
    target_fraction = round(u * share_target, 4)
    draft_fraction = round(u * (1 - share_target) / (1 - u * share_target), 4)
    if spec.triton.target_kv_cache_fraction is not None:
        target_fraction = spec.triton.target_kv_cache_fraction
    if spec.triton.draft_kv_cache_fraction is not None:
        draft_fraction = spec.triton.draft_kv_cache_fraction
    return MemoryPlan(
        target=target,
        draft=draft,
        gpu_bytes=gpu_bytes,
        usable_bytes_per_gpu=usable,
        reserve_bytes=RUNTIME_RESERVE_BYTES,
        free_for_kv_gpu0=free,
        kv_tokens_capacity=int(capacity),
        kv_tokens_needed=needed,
        target_kv_fraction=target_fraction,
        draft_kv_fraction=draft_fraction,
        fits=free > 0 and spec.target.tp_size <= spec.gpu.count,
        kv_sufficient=capacity >= needed,
    )


# -- the torch runtime: host memory ---------------------------------------------------------------------------------
TORCH_KV_SLOTS_PER_SEQUENCE = 2  # the in-flight engine keeps 2 x max_batch_size KV slots (trtspec.runtimes.inflight)


def host_memory() -> tuple[int, int]:
    """(total, available) bytes of this machine's RAM, from /proc/meminfo (sysconf when it cannot be read)."""
    import os

    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    total = fields.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total, fields.get("MemAvailable", total)


@dataclass(frozen=True)
class HostMemoryPlan:
    """What the torch runtime's served repository holds in RAM (every instance of each model, dequantized weights in
    the model dtype, and its KV slots), against this machine's memory; bytes."""

    target_weight_bytes: int
    draft_weight_bytes: int
    target_instances: int
    draft_instances: int
    kv_bytes: int
    kv_tokens: int
    needed_bytes: int
    total_bytes: int
    available_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def plan_host_memory(
    spec: BuildSpec, target_cfg: NormalizedConfig, draft_cfg: NormalizedConfig, machine: tuple[int, int] | None = None
) -> HostMemoryPlan:
    """The torch runtime's memory on this machine (``machine``: (total, available) bytes, default: measured)."""
    total, available = machine or host_memory()
    as_served: dict[str, ModelSpec] = {
        role: spec.target.model_copy(update={"quantization": Quantization.NONE})
        if role == "target"
        else spec.draft.model_copy(update={"quantization": Quantization.NONE})
        for role in ROLES
    }
    wt = weight_bytes(target_cfg, as_served["target"])
    wd = weight_bytes(draft_cfg, as_served["draft"])
    nt, nd = spec.triton.target_instances, spec.triton.draft_instances
    if not runs(spec, Role.DRAFT):  # drafter ngram: no draft model is loaded (build.layout.runs)
        wd, nd = 0, 0
    tokens = TORCH_KV_SLOTS_PER_SEQUENCE * spec.engine.max_batch_size * spec.engine.max_seq_len
    kv = tokens * (nt * kv_bytes_per_token(target_cfg, spec.target) + nd * kv_bytes_per_token(draft_cfg, spec.draft))
    return HostMemoryPlan(wt, wd, nt, nd, kv, tokens, nt * wt + nd * wd + kv, total, available)
