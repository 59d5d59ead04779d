"""The two exports of a quantized model, and the guards that keep them from being silently wrong.

- runtime ``trtllm-engine``: a TensorRT-LLM checkpoint (ModelOpt ``export_tensorrt_llm_checkpoint``) for trtllm-build;
- runtimes ``trtllm-llmapi`` and ``torch``: a unified HF checkpoint (ModelOpt ``export_hf_checkpoint``).

Guard: transformers 5 moved ``rope_theta`` (and ``rope_scaling``) into ``config.rope_parameters``, and
ModelOpt 0.47's TRT-LLM export reads ``config.rope_theta``: without a fix the checkpoint has no ``rotary_base`` and
TensorRT-LLM silently uses 10000. We restore the legacy attributes before the export and check the result after it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trtspec.errors import QuantizationError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
_REL_TOL = 1e-6


def source_rope(raw_config: dict[str, Any]) -> dict[str, Any]:
    """The source model's rope settings as {'rope_theta': float | None, 'rope_type': str, 'params': dict}."""
    params = raw_config.get("rope_parameters")
    params = dict(params) if isinstance(params, dict) and "rope_theta" in params else {}
    theta = raw_config.get("rope_theta", params.get("rope_theta"))
    legacy_raw = raw_config.get("rope_scaling")
    legacy: dict[str, Any] = legacy_raw if isinstance(legacy_raw, dict) else {}
    rope_type = params.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
    scaling = {k: v for k, v in (params or legacy).items() if k != "rope_theta"}
    return {"rope_theta": float(theta) if theta is not None else None, "rope_type": rope_type, "scaling": scaling}


def restore_legacy_rope(config: Any, rope: dict[str, Any]) -> list[str]:
    """Set ``config.rope_theta`` / ``config.rope_scaling`` from the source when transformers 5 left them out."""
    fixes = []
    if rope["rope_theta"] is not None and getattr(config, "rope_theta", None) is None:
        config.rope_theta = rope["rope_theta"]
        fixes.append(
            f"restored config.rope_theta={rope['rope_theta']:g} from rope_parameters for the TRT-LLM export "
            "(transformers 5 moved it; ModelOpt 0.47 would drop rotary_base)"
        )
    if rope["rope_type"] != "default" and not getattr(config, "rope_scaling", None):
        config.rope_scaling = {**rope["scaling"], "type": rope["rope_type"], "rope_type": rope["rope_type"]}
        fixes.append(f"restored config.rope_scaling (type {rope['rope_type']}) from rope_parameters")
    return fixes


def check_trtllm_rope(exported: dict[str, Any], rope: dict[str, Any]) -> None:
    """Raise QuantizationError unless the TRT-LLM config carries the source's rotary base (and scaling type)."""
    theta = rope["rope_theta"]
    base = exported.get("rotary_base")
    if theta is not None and (base is None or abs(float(base) - theta) > _REL_TOL * theta):
        used = base if base is not None else 10000
        raise QuantizationError(
            f"the exported TRT-LLM config has rotary_base {base} but the source model's rope_theta is {theta:g}: "
            f"TensorRT-LLM would use {used} and generate wrong text",
            hint="this is ModelOpt's transformers-5 rope_parameters bug; report it with `TRTSPEC_DEBUG=1` output",
        )
    if rope["rope_type"] != "default":
        scaling = exported.get("rotary_scaling") or {}
        if (scaling.get("type") or scaling.get("rope_type")) != rope["rope_type"]:
            raise QuantizationError(
                f"the exported TRT-LLM config has rotary_scaling {scaling or None} but the source uses rope type "
                f"{rope['rope_type']}",
                hint="report it with `TRTSPEC_DEBUG=1` output",
            )


def export_trtllm(
    model: Any, out_dir: Path, *, decoder_type: str, dtype: Any, tp_size: int, raw_source_config: dict[str, Any]
) -> list[str]:
    """TensorRT-LLM checkpoint (config.json + rank*.safetensors) into ``out_dir``; returns the fixes applied."""
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    rope = source_rope(raw_source_config)
    fixes = restore_legacy_rope(model.config, rope)
    try:
        export_tensorrt_llm_checkpoint(
            model, decoder_type=decoder_type, dtype=dtype, export_dir=out_dir, inference_tensor_parallel=tp_size
        )
    except (NotImplementedError, ValueError, AssertionError, KeyError) as exc:
        raise QuantizationError(
            f"ModelOpt's TRT-LLM export failed: {type(exc).__name__}: {exc}",
            hint=f"decoder type {decoder_type!r}; try another quantization format, or runtime "
            "trtllm-llmapi (unified HF checkpoint)",
        ) from exc
    exported = json.loads((Path(out_dir) / "config.json").read_text(encoding="utf-8"))
    check_trtllm_rope(exported, rope)
    return fixes


def export_hf(model: Any, out_dir: Path, *, dtype: Any, raw_source_config: dict[str, Any]) -> list[str]:
    """Unified HF checkpoint into ``out_dir``, with legacy config keys for transformers-4 readers; returns fixes."""
    from modelopt.torch.export import export_hf_checkpoint

    try:
        export_hf_checkpoint(model, dtype=dtype, export_dir=out_dir)
    except (NotImplementedError, ValueError, AssertionError, KeyError) as exc:
        raise QuantizationError(
            f"ModelOpt's HF export failed: {type(exc).__name__}: {exc}", hint="try another quantization format"
        ) from exc
    return add_legacy_config_keys(Path(out_dir) / "config.json", raw_source_config, dtype)


def add_legacy_config_keys(config_path: Path, raw_source_config: dict[str, Any], dtype: Any) -> list[str]:
    """Write ``rope_theta`` / ``rope_scaling`` / ``torch_dtype`` at the top level too, and check the rope base.

    TensorRT-LLM 1.x's LLM API reads configs with transformers 4.x, which knows ``rope_theta`` but not transformers 5's
    ``rope_parameters``: without the legacy key it would fall back to 10000, the same bug as the TRT-LLM export.
    """
    cfg = json.loads(config_path.read_text(encoding="utf-8"))
    rope = source_rope(raw_source_config)
    exported = source_rope(cfg)
    if (
        rope["rope_theta"] is not None
        and exported["rope_theta"] is not None
        and abs(exported["rope_theta"] - rope["rope_theta"]) > _REL_TOL * rope["rope_theta"]
    ):
        raise QuantizationError(
            f"exported config.json has rope_theta {exported['rope_theta']:g}, the source {rope['rope_theta']:g}",
            hint="report it with `TRTSPEC_DEBUG=1` output",
        )
    fixes = []
    if rope["rope_theta"] is not None and "rope_theta" not in cfg:
        cfg["rope_theta"] = rope["rope_theta"]
        fixes.append(f"wrote rope_theta={rope['rope_theta']:g} at the top of config.json for transformers-4 readers")
    if rope["rope_type"] != "default" and not cfg.get("rope_scaling"):
        cfg["rope_scaling"] = {**rope["scaling"], "rope_type": rope["rope_type"], "type": rope["rope_type"]}
        fixes.append(f"wrote rope_scaling (type {rope['rope_type']}) at the top of config.json")
    if "torch_dtype" not in cfg:
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return fixes


def copy_tokenizer_files(src: Path, out_dir: Path) -> list[str]:
    """Copy the tokenizer (and chat template, generation config) next to the checkpoint; returns the names copied."""
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file() and not (Path(out_dir) / name).exists():
            shutil.copy2(Path(src) / name, Path(out_dir) / name)
            copied.append(name)
    return copied
