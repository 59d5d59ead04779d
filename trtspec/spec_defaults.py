"""Defaults that depend on the models or the machine: the quantization format of each model on a GPU runtime, and
the dtype of the embedded example on this CPU (:func:`cpu_dtype`).

An empty ``quantization`` on runtime trtllm-engine or trtllm-llmapi becomes the first format of the role's preference
list that the model's shapes and the GPU allow (trtspec.build.formats owns the lists and the rules), read from
config.json only. The torch runtime keeps ``none``. Each choice comes with a note that `trtspec init` writes into the
spec.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtspec.build.engine_rules import refusal
from trtspec.build.formats import KVCacheFormat, Quantization, choose_format, linear_input_dims, parse_capability

# CPU flags of native bfloat16 arithmetic (Linux /proc/cpuinfo names): AVX512-BF16 (Cooper Lake, Zen 4 on), AMX.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_dtype(cpuinfo: str | None = None) -> str:
    """The torch runtime's dtype for the embedded example on this CPU: bfloat16 where the CPU has native bfloat16
    arithmetic, else float32. Measured on the 2-core development CPU (AVX512-BF16), SmolLM2-135M, in process,
    benchmarks/workloads_cpu.py: float32 decodes a token in 52 ms but verifies 2-5 tokens in 100-137 ms, so no drafter
    pays (adaptive speculation 0.98x target-only, best fixed 0.81x); bfloat16 verifies 5 tokens for the price of one
    (trtspec.runtimes.inflight.llama_step), and speculation pays 1.5-1.6x its own target-only. Without native
    bfloat16 the multiplies are emulated and float32 stays. ``cpuinfo``: the text of /proc/cpuinfo (read when None;
    other systems: float32)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return "float32"
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and NATIVE_BF16_FLAGS & set(line.split(":", 1)[-1].split()):
            return "bfloat16"
    return "float32"


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


def _engine_refusal(
    runtime: str, kv_raw: Any, capability: tuple[int, int] | None
) -> Callable[[Quantization], str | None] | None:
    """For trtllm-engine, the builder rules for this model's KV cache (trtspec.build.engine_rules); else None."""
    if runtime != "trtllm-engine":
        return None
    try:
        kv = KVCacheFormat(kv_raw if kv_raw is not None else KVCacheFormat.AUTO.value)
    except ValueError:
        return None  # validation reports the value
    return lambda q: refusal(q, kv, capability)


def fill_gpu_defaults(data: dict[str, Any], base: Path) -> dict[str, str]:
    """Set each empty ``<role>.quantization`` of a GPU-runtime spec dict in place; return notes by field path."""
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
        refused = _engine_refusal(runtime, section.get("kv_cache"), capability)
        cfg = _read_model_config(section.get("model"), base)
        if cfg is None:
            static, _ = choose_format(role, [], None, refused)  # the first preference the builder takes
            section["quantization"] = static.value
            notes[f"{role}.quantization"] = (
                f"{static.value}: the {runtime} default; not checked against the model "
                "(its config.json could not be read)"
            )
            continue
        chosen, passed = choose_format(role, linear_input_dims(cfg), capability, refused)
        section["quantization"] = chosen.value
        why = f" (passed over: {'; '.join(passed)})" if passed else ""
        notes[f"{role}.quantization"] = f"{chosen.value}, the best format this {role} takes on {runtime}{why}"
    return notes
