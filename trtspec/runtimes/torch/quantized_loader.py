"""Load a ModelOpt unified HF checkpoint for the torch runtime, with its scales applied.

``AutoModelForCausalLM.from_pretrained`` ignores the ``*_scale`` tensors of a ModelOpt export (FP8 weights come back
unscaled, INT4 weights do not even fit), so a quantized model loaded that way is garbage. This loader builds the model
from its config, loads the unquantized tensors (embeddings, norms, LM head) normally, and replaces every quantized
linear layer with a ``qlinear.QuantLinear`` that computes what the calibrated model computed.
It needs torch and transformers only, not ModelOpt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.errors import ModelLoadError, QuantizationError

HF_QUANT_CONFIG = "hf_quant_config.json"
_LINEAR_TENSORS = ("weight", "bias", "weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: unreadable ({exc})", hint="re-export the checkpoint") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object", hint="re-export the checkpoint")
    return data


def read_quant_config(path: Path) -> dict[str, Any] | None:
    """The ``quantization`` section of a ModelOpt export (hf_quant_config.json or config.json), or None."""
    path = Path(path)
    if (path / HF_QUANT_CONFIG).is_file():
        data = _read_json(path / HF_QUANT_CONFIG)
        if isinstance(data.get("quantization"), dict):
            return data["quantization"]
    if (path / "config.json").is_file():
        qc = _read_json(path / "config.json").get("quantization_config")
        if isinstance(qc, dict) and qc.get("quant_method") == "modelopt":
            return qc
    return None


def is_modelopt_checkpoint(path: Path) -> bool:
    """True when ``path`` holds a quantized checkpoint exported by ModelOpt's ``export_hf_checkpoint``."""
    try:
        qc = read_quant_config(Path(path))
    except ModelLoadError:
        return False
    return qc is not None and bool(qc.get("quant_algo") or qc.get("kv_cache_quant_algo"))


def _load_tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(_read_json(index).get("weight_map", {}).values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights", hint="re-export the checkpoint with trtspec quantize")
    tensors: dict[str, Any] = {}
    for name in files:
        tensors.update(load_file(str(path / name)))
    return tensors


def _layer_algo(qc: dict[str, Any], name: str) -> str:
    algo = qc.get("quant_algo")
    if algo == "MIXED_PRECISION":  # per-layer formats
        layer = (qc.get("quantized_layers") or {}).get(name) or {}
        algo = layer.get("quant_algo")
    if not algo:
        raise QuantizationError(
            f"layer {name} has scales but no quant_algo in {HF_QUANT_CONFIG}", hint="re-export the checkpoint"
        )
    return str(algo)


def load_modelopt_checkpoint(path: Path, dtype: str = "float32") -> Any:
    """A ModelOpt HF export as a transformers causal LM in eval mode, quantized layers computing as calibrated."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from trtspec.runtimes.torch.qlinear import (
        FP8_MAX,
        QuantLinear,
        dequantize_weight,
        enable_kv_fake_quant,
        set_submodule,
    )

    path = Path(path)
    qc = read_quant_config(path)
    if qc is None:
        raise ModelLoadError(
            f"{path}: not a ModelOpt checkpoint (no {HF_QUANT_CONFIG})",
            hint="load unquantized checkpoints with AutoModelForCausalLM.from_pretrained",
        )
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ModelLoadError(f"unknown dtype {dtype!r}", hint="use float32, bfloat16 or float16")
    config = AutoConfig.from_pretrained(path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # transformers has no quantizer for quant_method "modelopt": we apply it
    tensors = _load_tensors(path)
    with no_init_weights():  # every parameter is overwritten below; random init would only cost time
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)

    kv_algo = qc.get("kv_cache_quant_algo")
    kv_scales: dict[str, tuple[str, Any, Any]] = {}
    quantized: list[str] = []
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear) and f"{name}.weight_scale" in tensors:
            t = {k: tensors.pop(f"{name}.{k}", None) for k in _LINEAR_TENSORS}
            algo = _layer_algo(qc, name)
            weight = dequantize_weight(algo, t["weight"], t["weight_scale"], t["weight_scale_2"], name=name)
            if tuple(weight.shape) != (module.out_features, module.in_features):
                raise ModelLoadError(
                    f"{path}: {name}.weight dequantizes to {tuple(weight.shape)}, the config says "
                    f"{(module.out_features, module.in_features)}",
                    hint="re-export the checkpoint",
                )
            input_amax = (
                t["input_scale"].to(torch.float32) * (FP8_MAX if algo in ("FP8", "W4A8_AWQ") else 127.0)
                if t["input_scale"] is not None
                else None
            )
            set_submodule(
                model,
                name,
                QuantLinear(
                    weight.to(torch_dtype),
                    t["bias"].to(torch_dtype) if t["bias"] is not None else None,
                    algo=algo,
                    input_amax=input_amax,
                    pre_quant_scale=t["pre_quant_scale"],
                ),
            )
            quantized.append(name + ".")
        k_scale = tensors.pop(f"{name}.k_proj.k_scale", None)
        v_scale = tensors.pop(f"{name}.v_proj.v_scale", None)
        if k_scale is not None and v_scale is not None and kv_algo:
            bound = FP8_MAX if kv_algo == "FP8" else 127.0
            kv_scales[name] = (str(kv_algo), k_scale.float() * bound, v_scale.float() * bound)

    tensors = {k: v.to(torch_dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    result = model.load_state_dict(tensors, strict=False, assign=True)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    missing = [
        k
        for k in result.missing_keys
        if k not in tied and not k.endswith("lm_head.weight") and not k.startswith(tuple(quantized))
    ]
    if missing or result.unexpected_keys:
        what = f"missing {missing[:3]}" if missing else f"unexpected {result.unexpected_keys[:3]}"
        raise ModelLoadError(
            f"{path}: checkpoint tensors do not match the model ({what})",
            hint="re-export the checkpoint with trtspec quantize",
        )
    if "lm_head.weight" in result.missing_keys and not getattr(config, "tie_word_embeddings", False):
        raise ModelLoadError(
            f"{path}: no lm_head.weight and tie_word_embeddings is false",
            hint="re-export the checkpoint with trtspec quantize",
        )
    enable_kv_fake_quant(model, kv_scales)
    return model.eval()
