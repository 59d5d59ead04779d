"""Defaults that depend on the models: the quantization format of each model on a GPU runtime.

An empty ``quantization`` on runtime trtllm-engine or trtllm-llmapi becomes the first format of the role's preference
list that the model's shapes and the GPU allow (trtspec.build.formats knows which fit), read from config.json only.
The torch runtime keeps ``none``. Each choice comes with a note that `trtspec init` writes into the spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Best first. Target: FP8 on Ada/Hopper/Blackwell; 4-bit weights where FP8 tensor cores are missing. Draft: 4-bit
# weights first (a draft step is memory-bound, its weights are what it reads), then FP8.
PREFERENCES: dict[str, tuple[str, ...]] = {
    "target": ("fp8", "int4_awq", "int8_sq", "int8_wo"),
    "draft": ("int4_awq", "fp8", "int8_wo", "int8_sq"),
}
_STATIC = {"target": "fp8", "draft": "int4_awq"}  # when the model's config cannot be read


def linear_input_dims(cfg: Any) -> list[tuple[str, int]]:
    """The input dimensions of a decoder's quantized linears, named as the config names them."""
    return [
        ("hidden_size", cfg.hidden_size),
        ("num_attention_heads x head_dim", cfg.num_attention_heads * cfg.head_dim),
        ("intermediate_size", cfg.intermediate_size),
    ]


def choose_format(
    role: str, dims: list[tuple[str, int]], compute_capability: tuple[int, int] | None
) -> tuple[str, list[str]]:
    """The best format of ``role``'s preference list that these dimensions and GPU allow, and why the better ones
    were passed over."""
    from trtspec.build.formats import FORMATS, FP8_FAST_CC
    from trtspec.spec import Quantization

    passed: list[str] = []
    for name in PREFERENCES[role]:
        fmt = FORMATS[Quantization(name)]
        if fmt.uses_fp8 and compute_capability is not None and compute_capability < FP8_FAST_CC:
            passed.append(
                f"{name} needs compute capability >= {FP8_FAST_CC[0]}.{FP8_FAST_CC[1]}, "
                f"gpu.compute_capability is {compute_capability[0]}.{compute_capability[1]}"
            )
            continue
        bad = [(n, d) for n, d in dims if fmt.block_size and d % fmt.block_size]
        if bad:
            passed.append(
                f"{name} needs input dimensions that are multiples of {fmt.block_size}, {bad[0][0]} is {bad[0][1]}"
            )
            continue
        return name, passed
    return "none", passed


def _read_model_config(ref: Any, base: Path) -> Any:
    """The model's normalized config, or None when it cannot be read now (check reports why)."""
    from trtspec.errors import TrtspecError
    from trtspec.families import read_config
    from trtspec.hub import resolve_model

    if not isinstance(ref, str) or not ref.strip():
        return None
    try:
        return read_config(resolve_model(ref, base, weights=False))
    except TrtspecError:
        return None


def fill_gpu_defaults(data: dict[str, Any], base: Path) -> dict[str, str]:
    """Set each empty ``<role>.quantization`` of a GPU-runtime spec dict in place; return notes by field path."""
    from trtspec.build.formats import parse_capability

    runtime = data.get("runtime", "torch")
    if runtime not in ("trtllm-engine", "trtllm-llmapi"):
        return {}
    gpu_raw = data.get("gpu")
    gpu: dict[str, Any] = gpu_raw if isinstance(gpu_raw, dict) else {}
    capability = parse_capability(gpu.get("compute_capability"))
    notes: dict[str, str] = {}
    for role in ("target", "draft"):
        section = data.get(role)
        if not isinstance(section, dict) or section.get("quantization") is not None:
            continue
        cfg = _read_model_config(section.get("model"), base)
        if cfg is None:
            section["quantization"] = _STATIC[role]
            notes[f"{role}.quantization"] = (
                f"{_STATIC[role]}: the {runtime} default; not checked against the model "
                "(its config.json could not be read)"
            )
            continue
        name, passed = choose_format(role, linear_input_dims(cfg), capability)
        section["quantization"] = name
        why = f" (passed over: {'; '.join(passed)})" if passed else ""
        notes[f"{role}.quantization"] = f"{name}, the best format this {role} takes on {runtime}{why}"
    return notes
