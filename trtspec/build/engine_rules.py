"""TensorRT-LLM engine-builder rules that a spec can hit: one table, each row with the upstream source it encodes.

trtspec builds both engines with paged context FMHA (``--use_paged_context_fmha enable``: the draft-target recipe needs
it on both, examples/draft_target_model/README.md). TensorRT-LLM's builder (``tensorrt_llm/builder.py`` ``build()``)
refuses some KV-cache x weight-format x GPU combinations with paged context FMHA, or turns paged context FMHA off for
them (release lines 0.20-1.1; older builders raise), and its attention plugin refuses them at run time. `trtspec
check` reports each broken rule in one line with the combination that works; `trtspec init` (through
:func:`trtspec.build.formats.choose_format`) never picks a format a rule refuses. The rows are recorded as upstream
facts in ``tests/upstream/trtllm_builder_rules.json``. The rules apply to runtime trtllm-engine only: the LLM API's
PyTorch backend builds no engine.

This module imports only :mod:`trtspec.build.formats`, so that the spec defaults can read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trtspec.build.formats import FP8_FAST_CC, KVCacheFormat, Quantization

Capability = tuple[int, int] | None

BUILDER_PY = "NVIDIA/TensorRT-LLM tensorrt_llm/builder.py build() @008b2b8d (0.20-1.1; older builders raise)"
ATTENTION_PLUGIN = "NVIDIA/TensorRT-LLM cpp/tensorrt_llm/plugins/gptAttentionCommon/gptAttentionCommon.cpp"

# Weight formats whose checkpoints TensorRT-LLM runs in its FP8 QDQ workflow (QuantMode.has_fp8_qdq): the only ones an
# FP8 KV cache works with under paged context FMHA in every builder and in the attention plugin's run-time check.
FP8_QDQ_FORMATS = (Quantization.FP8,)
# Blackwell data-center parts (SM 10.x): the builder refuses INT8/INT4 weight-only, SmoothQuant and an INT8 KV cache.
SM100 = ((10, 0), (12, 0))
SM100_REFUSED = (Quantization.INT8_WO, Quantization.INT4_AWQ, Quantization.INT8_SQ)


@dataclass(frozen=True)
class BuilderRule:
    """One rule of TensorRT-LLM's builder: when it breaks, what upstream does, what works instead, and where it is."""

    name: str
    broken: Callable[[Quantization, KVCacheFormat, Capability], bool]
    upstream: str  # what TensorRT-LLM does, in its words
    works: Callable[[Quantization, KVCacheFormat], str]  # the combination that works
    source: str


def _sm100(cc: Capability) -> bool:
    return cc is not None and SM100[0] <= cc < SM100[1]


BUILDER_RULES: tuple[BuilderRule, ...] = (
    BuilderRule(
        "paged-context-fmha-int8-kv",
        lambda q, kv, cc: kv is KVCacheFormat.INT8,
        "Paged Context FMHA doesn't work with int8 kv cache currently",
        lambda q, kv: f"kv_cache fp8 with quantization fp8, or kv_cache auto with {q.value}",
        f"{BUILDER_PY}; {ATTENTION_PLUGIN}",
    ),
    BuilderRule(
        "paged-context-fmha-fp8-kv-needs-fp8-weights",
        lambda q, kv, cc: kv is KVCacheFormat.FP8 and q not in FP8_QDQ_FORMATS,
        "FP8 Paged Context FMHA only works with fp8 quantization workflow currently",
        lambda q, kv: f"quantization fp8 with kv_cache fp8, or kv_cache auto with {q.value}",
        f"{BUILDER_PY}; {ATTENTION_PLUGIN}",
    ),
    BuilderRule(
        "fp8-context-fmha-needs-sm89",
        lambda q, kv, cc: kv is KVCacheFormat.FP8 and cc is not None and cc < FP8_FAST_CC,
        "FP8 context FMHA is disabled because it is only supported on Ada and Hopper Arch, "
        "so FP8 Paged Context FMHA is disabled",
        lambda q, kv: f"kv_cache auto with {q.value} on this GPU (FP8 KV needs compute capability >= 8.9)",
        BUILDER_PY,
    ),
    BuilderRule(
        "sm100-no-int8-int4",
        lambda q, kv, cc: _sm100(cc) and (q in SM100_REFUSED or kv is KVCacheFormat.INT8),
        "INT8/INT4 quantization and SmoothQuant are not supported on SM>=100",
        lambda q, kv: "quantization fp8 or nvfp4 (kv_cache auto or fp8) on compute capability 10.x",
        BUILDER_PY,
    ),
)


def broken_rules(q: Quantization, kv: KVCacheFormat, cc: Capability) -> list[BuilderRule]:
    """The builder rules this weight format, KV-cache format and GPU break (none for a combination that builds)."""
    return [r for r in BUILDER_RULES if r.broken(q, kv, cc)]


def refusal(q: Quantization, kv: KVCacheFormat, cc: Capability) -> str | None:
    """One line naming the first broken rule and what works instead; None when the combination builds."""
    rules = broken_rules(q, kv, cc)
    if not rules:
        return None
    r = rules[0]
    return (
        f"{q.value} with kv_cache {kv.value}: {r.upstream} (TensorRT-LLM builder rule {r.name}); use {r.works(q, kv)}"
    )
