"""Quantization formats, the one home of their rules: the spec values (``Quantization``, ``KVCacheFormat``), what
each means to ModelOpt and TensorRT-LLM (``FORMATS``), the default and the preference order per role, and the guards
(block size, CUDA only, FP8 compute capability).

The spec (its field descriptions and runtime defaults), `trtspec init` (trtspec.spec_defaults), `trtspec check` and the
quantize stage all read them from here. Every guard runs before a model's weights are loaded or calibrated, so a
format that cannot work on this model or this machine fails in a second with a hint, never after minutes of
calibration. This module imports no torch and nothing of trtspec but its errors, so that the spec can import it.
The TensorRT-LLM builder's rules on format combinations are in :mod:`trtspec.build.engine_rules`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from trtspec.errors import QuantizationError

FP8_FAST_CC = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell


class Quantization(str, Enum):
    """ModelOpt post-training quantization formats trtspec knows."""

    NONE = "none"
    FP8 = "fp8"
    INT8_SQ = "int8_sq"
    INT8_WO = "int8_wo"
    INT4_AWQ = "int4_awq"
    W4A8_AWQ = "w4a8_awq"
    NVFP4 = "nvfp4"


class KVCacheFormat(str, Enum):
    """KV-cache storage format; ``auto`` keeps the model dtype."""

    AUTO = "auto"
    FP8 = "fp8"
    INT8 = "int8"


# Best first, per role, on the GPU runtimes. Target: FP8 on Ada/Hopper/Blackwell; 4-bit weights where FP8 tensor cores
# are missing. Draft: 4-bit weights first (a draft step is memory-bound, its weights are what it reads), then FP8.
# The first of each list is also the default when the model's config cannot be read; the torch runtime keeps none.
PREFERENCES: dict[str, tuple[Quantization, ...]] = {
    "target": (Quantization.FP8, Quantization.INT4_AWQ, Quantization.INT8_SQ, Quantization.INT8_WO),
    "draft": (Quantization.INT4_AWQ, Quantization.FP8, Quantization.INT8_WO, Quantization.INT8_SQ),
}


def default_format(role: str, gpu_runtime: bool) -> Quantization:
    """The format of an empty ``<role>.quantization`` when nothing about the model is known: the role's first
    preference on a GPU runtime, none on the torch runtime."""
    return PREFERENCES[role][0] if gpu_runtime else Quantization.NONE


def preferences_text() -> str:
    """The preference lists as the spec's field description and the README say them."""
    return "; ".join(f"{role}: {', '.join(q.value for q in order)}" for role, order in PREFERENCES.items())


# The torch runtime's QuantLinear (trtspec.runtimes.torch.qlinear): TRT-LLM QuantAlgo of a layer -> how its
# inputs are quantized (weights are dequantized once at load time). Here so that build's checks need no torch.
TORCH_ACTIVATION_KIND: dict[str, str | None] = {
    "FP8": "fp8",
    "W8A8_SQ_PER_CHANNEL": "int8",
    "W8A16": None,
    "W4A16_AWQ": None,
    "W4A8_AWQ": "fp8",
}
TORCH_SUPPORTED_ALGOS = tuple(TORCH_ACTIVATION_KIND)


@dataclass(frozen=True)
class QuantFormat:
    """One spec quantization value, mapped to ModelOpt and TensorRT-LLM."""

    quantization: Quantization
    modelopt_cfg: str | None  # attribute of modelopt.torch.quantization holding the preset
    trtllm_algo: str | None  # QuantAlgo written into the TRT-LLM checkpoint's config.json
    block_size: int | None = None  # weights are quantized in blocks of this many input channels
    needs_cuda: bool = False  # ModelOpt's fake-quant kernels for the format exist only for CUDA
    uses_fp8: bool = False  # FP8 weights or activations: fast only on compute capability >= 8.9
    description: str = ""


FORMATS: dict[Quantization, QuantFormat] = {
    f.quantization: f
    for f in (
        QuantFormat(Quantization.NONE, None, None, description="no quantization (dtype of the spec)"),
        QuantFormat(
            Quantization.FP8,
            "FP8_DEFAULT_CFG",
            "FP8",
            uses_fp8=True,
            description="FP8 E4M3 weights and activations, per-tensor scales",
        ),
        QuantFormat(
            Quantization.INT8_SQ,
            "INT8_SMOOTHQUANT_CFG",
            "W8A8_SQ_PER_CHANNEL",
            description="INT8 weights (per channel) and activations (per tensor), SmoothQuant",
        ),
        QuantFormat(
            Quantization.INT8_WO,
            "INT8_WEIGHT_ONLY_CFG",
            "W8A16",
            description="INT8 weights per channel, activations in the model dtype",
        ),
        QuantFormat(
            Quantization.INT4_AWQ,
            "INT4_AWQ_CFG",
            "W4A16_AWQ",
            block_size=128,
            description="INT4 weights in blocks of 128 (AWQ), activations in the model dtype",
        ),
        QuantFormat(
            Quantization.W4A8_AWQ,
            "W4A8_AWQ_BETA_CFG",
            "W4A8_AWQ",
            block_size=128,
            uses_fp8=True,
            description="INT4 weights in blocks of 128 (AWQ), FP8 activations",
        ),
        QuantFormat(
            Quantization.NVFP4,
            "NVFP4_DEFAULT_CFG",
            "NVFP4",
            block_size=16,
            needs_cuda=True,
            uses_fp8=True,
            description="FP4 E2M1 weights and activations in blocks of 16 with FP8 scales (Blackwell)",
        ),
    )
}

# KV-cache formats: the ModelOpt quantizer entries appended to the weight preset, and TRT-LLM's kv_cache_quant_algo.
_KV_ENTRIES: dict[KVCacheFormat, list[dict[str, Any]]] = {
    KVCacheFormat.FP8: [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}}],
    KVCacheFormat.INT8: [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": 8, "axis": None}}],
}


def get_format(q: Quantization | str) -> QuantFormat:
    """The format table entry for a spec value (raises QuantizationError listing the known values)."""
    try:
        return FORMATS[Quantization(q)]
    except ValueError:
        raise QuantizationError(
            f"unknown quantization format {q!r}", hint=f"use one of: {', '.join(f.value for f in Quantization)}"
        ) from None


def modelopt_config(q: Quantization, kv: KVCacheFormat) -> dict[str, Any]:
    """The ModelOpt ``mtq.quantize`` config for a weight format plus a KV-cache format (a deep copy)."""
    import modelopt.torch.quantization as mtq

    fmt = get_format(q)
    if fmt.modelopt_cfg is None:
        base: dict[str, Any] = {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
    else:
        base = copy.deepcopy(getattr(mtq, fmt.modelopt_cfg))
    if kv in _KV_ENTRIES:
        # Same effect as modelopt.torch.quantization.utils.update_quant_cfg_with_kv_cache_quant, without its print.
        base["quant_cfg"] = list(base.get("quant_cfg") or []) + copy.deepcopy(_KV_ENTRIES[kv])
        base.setdefault("algorithm", "max")
    return base


def check_machine(q: Quantization, kv: KVCacheFormat, *, cuda_available: bool, hf_export: bool) -> None:
    """Refuse, before any work, formats this machine or the chosen export cannot produce."""
    fmt = get_format(q)
    if fmt.needs_cuda and not cuda_available:
        others = ", ".join(f.quantization.value for f in FORMATS.values() if f.modelopt_cfg and not f.needs_cuda)
        raise QuantizationError(
            f"{q.value} calibration needs a CUDA GPU and this machine has none "
            "(ModelOpt's NVFP4/MX kernels are CUDA-only)",
            hint=f"run `trtspec quantize` on a GPU machine, or pick a CPU-capable format: {others}",
        )
    if kv is KVCacheFormat.INT8 and hf_export:
        raise QuantizationError(
            "an INT8 KV cache cannot be written into a unified HF checkpoint "
            "(ModelOpt 0.47 exports only FP8 KV scales)",
            hint="use kv_cache: fp8, or runtime trtllm-engine (its TRT-LLM checkpoint supports INT8 KV)",
        )


def fp8_capability_warning(
    q: Quantization, kv: KVCacheFormat, capabilities: Iterable[tuple[str, tuple[int, int]]]
) -> str | None:
    """A warning when an FP8-using format targets a GPU below compute capability 8.9 (it runs, but slowly)."""
    if not (get_format(q).uses_fp8 or kv is KVCacheFormat.FP8):
        return None
    for where, cc in capabilities:
        if tuple(cc) < FP8_FAST_CC:
            what = q.value if get_format(q).uses_fp8 else "an FP8 KV cache"
            return (
                f"{what} needs compute capability >= {FP8_FAST_CC[0]}.{FP8_FAST_CC[1]} for FP8 tensor cores; "
                f"{where} is {cc[0]}.{cc[1]}: TensorRT-LLM falls back to slower kernels or refuses FP8 there"
            )
    return None


def parse_capability(text: str | None) -> tuple[int, int] | None:
    """'9.0' -> (9, 0); None when empty or not of that form."""
    if not text:
        return None
    major, _, minor = str(text).partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return None


def needs_cuda(q: Quantization) -> bool:
    """ModelOpt calibrates this format only on a CUDA GPU (its NVFP4/MX fake-quant kernels are CUDA-only)."""
    return get_format(q).needs_cuda


def block_size_problem(q: Quantization, linears: Iterable[tuple[str, int]]) -> tuple[str, int] | None:
    """The first quantized linear (name, input dimension) whose input dimension is not a multiple of the block."""
    fmt = get_format(q)
    if fmt.block_size is None:
        return None
    for name, in_features in linears:
        if in_features % fmt.block_size:
            return name, in_features
    return None


def block_size_text(q: Quantization, problem: tuple[str, int]) -> str:
    """One line saying why a block format does not fit: the block and the first dimension it cannot pack."""
    block = get_format(q).block_size
    return f"{q.value} needs input dimensions that are multiples of {block}, {problem[0]} is {problem[1]}"


def formats_that_fit(linears: Sequence[tuple[str, int]], *, cuda_available: bool) -> list[str]:
    """Quantization formats that this model's linear shapes and this machine allow."""
    ok = []
    for fmt in FORMATS.values():
        if fmt.modelopt_cfg is None or (fmt.needs_cuda and not cuda_available):
            continue
        if block_size_problem(fmt.quantization, linears) is not None:
            continue
        ok.append(fmt.quantization.value)
    return ok


def linear_input_dims(cfg: Any) -> list[tuple[str, int]]:
    """The input dimensions of a decoder's quantized linears, named as its config names them (from config.json only;
    ``quantized_linears`` reads the same from a loaded model)."""
    return [
        ("hidden_size", cfg.hidden_size),
        ("num_attention_heads x head_dim", cfg.num_attention_heads * cfg.head_dim),
        ("intermediate_size", cfg.intermediate_size),
    ]


def choose_format(
    role: str,
    dims: Sequence[tuple[str, int]],
    compute_capability: tuple[int, int] | None,
    refused: Callable[[Quantization], str | None] | None = None,
) -> tuple[Quantization, list[str]]:
    """The best format of ``role``'s preference list that these dimensions and GPU allow and that ``refused`` (the
    runtime's rules for the model's KV cache: trtspec.build.engine_rules) does not refuse, and why the better ones
    were passed over."""
    passed: list[str] = []
    for q in PREFERENCES[role]:
        fmt = FORMATS[q]
        why_not = refused(q) if refused is not None else None
        if why_not is not None:
            passed.append(why_not)
            continue
        if fmt.uses_fp8 and compute_capability is not None and compute_capability < FP8_FAST_CC:
            passed.append(
                f"{q.value} needs compute capability >= {FP8_FAST_CC[0]}.{FP8_FAST_CC[1]}, "
                f"gpu.compute_capability is {compute_capability[0]}.{compute_capability[1]}"
            )
            continue
        problem = block_size_problem(q, dims)
        if problem is not None:
            passed.append(block_size_text(q, problem))
            continue
        return q, passed
    return Quantization.NONE, passed


def check_block_size(q: Quantization, linears: list[tuple[str, int]], *, cuda_available: bool) -> None:
    """Raise QuantizationError naming the layer and dimension a block format cannot pack, and the formats that fit."""
    problem = block_size_problem(q, linears)
    if problem is None:
        return
    name, dim = problem
    block = get_format(q).block_size
    assert block is not None  # block_size_problem reports only formats with a block size
    fits = formats_that_fit(linears, cuda_available=cuda_available)
    raise QuantizationError(
        f"{q.value} quantizes weights in blocks of {block} input channels, but layer {name} has input dimension {dim} "
        f"({dim} % {block} = {dim % block})",
        hint=f"formats that work for this model here: {', '.join(fits) or 'none'}",
    )


def quantized_linears(model: Any) -> list[tuple[str, int]]:
    """(name, in_features) of the nn.Linear layers ModelOpt's presets quantize (every one but the LM head)."""
    import torch

    out = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "lm_head" not in name and not name.endswith("output_layer"):
            out.append((name, int(module.in_features)))
    return out
