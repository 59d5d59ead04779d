"""Read a TensorRT-LLM checkpoint (decoder ``llama``) back into a transformers model, to verify an export on a CPU.

trtllm-build cannot run here, so this reader (used by tests only) is how trtspec checks that a TRT-LLM checkpoint
written by ModelOpt holds the calibrated model: it maps the checkpoint's tensors (``transformer.layers.N.attention.qkv``
...) and config fields (``rotary_base``, ``quantization``) to a LlamaForCausalLM with ``QuantLinear`` layers
(trtspec.runtimes.torch.qlinear), using TRT-LLM's own defaults where a field is missing (so a dropped
``rotary_base`` shows up as rope theta 10000).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.errors import ModelLoadError, QuantizationError

TRTLLM_DEFAULT_ROTARY_BASE = 10000.0  # what TensorRT-LLM's PretrainedConfig assumes when rotary_base is absent
_HF_NAMES = {
    "attention.dense": "self_attn.o_proj",
    "mlp.fc": "mlp.gate_proj",
    "mlp.gate": "mlp.up_proj",
    "mlp.proj": "mlp.down_proj",
}


def read_trtllm_config(ckpt_dir: Path) -> dict[str, Any]:
    """The checkpoint's config.json."""
    path = Path(ckpt_dir) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: unreadable ({exc})", hint="re-run trtspec quantize") from None
    return data


def _hf_config(cfg: dict[str, Any]) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(  # type: ignore[call-arg]  # rope_theta: transformers 5 takes it as a legacy keyword
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg.get("num_key_value_heads"),
        head_dim=cfg.get("head_size"),
        intermediate_size=cfg["intermediate_size"],
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        rms_norm_eps=cfg.get("norm_epsilon", 1e-6),
        hidden_act=cfg.get("hidden_act", "silu"),
        tie_word_embeddings=bool(cfg.get("share_embedding_table", False)),
        rope_theta=float(cfg.get("rotary_base", TRTLLM_DEFAULT_ROTARY_BASE)),
        attention_bias=bool(cfg.get("bias")),
    )


def _split_rows(t: Any, sizes: list[int]) -> list[Any]:
    """Split a fused qkv tensor by output rows; per-tensor (single-element) scales are shared."""
    if t is None or t.numel() == 1:
        return [t] * len(sizes)
    total = sum(sizes)
    factor = t.shape[0] / total  # packed INT4 rows hold two output rows each
    return list(t.split([int(s * factor) for s in sizes], dim=0))


def load_trtllm_checkpoint(ckpt_dir: Path, dtype: str = "float32") -> Any:
    """A single-rank TRT-LLM llama checkpoint as a LlamaForCausalLM computing what the checkpoint's numbers say."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM
    from transformers.initialization import no_init_weights

    from trtspec.runtimes.torch.qlinear import (
        FP8_MAX,
        QuantLinear,
        dequantize_weight,
        enable_kv_fake_quant,
        set_submodule,
    )

    ckpt_dir = Path(ckpt_dir)
    cfg = read_trtllm_config(ckpt_dir)
    if cfg.get("decoder", cfg.get("architecture")) not in ("llama", "LlamaForCausalLM", "MistralForCausalLM"):
        raise QuantizationError(
            f"{ckpt_dir}: decoder {cfg.get('decoder')!r}: only llama checkpoints can be read back",
            hint="verify other families on a GPU with trtllm-build",
        )
    if cfg.get("mapping", {}).get("world_size", 1) != 1:
        raise QuantizationError(
            f"{ckpt_dir}: a {cfg['mapping']['world_size']}-rank checkpoint",
            hint="only single-rank checkpoints can be read back",
        )
    quant = cfg.get("quantization") or {}
    algo, kv_algo = quant.get("quant_algo"), quant.get("kv_cache_quant_algo")
    t = load_file(str(ckpt_dir / "rank0.safetensors"))
    torch_dtype = getattr(torch, dtype)
    hf_cfg = _hf_config(cfg)
    with no_init_weights():
        model = LlamaForCausalLM(hf_cfg).to(torch_dtype)
    vocab = hf_cfg.vocab_size
    state = {
        "model.embed_tokens.weight": t.pop("transformer.vocab_embedding.weight")[:vocab],
        "model.norm.weight": t.pop("transformer.ln_f.weight"),
    }
    if "lm_head.weight" in t:
        state["lm_head.weight"] = t.pop("lm_head.weight")[:vocab]
    head = hf_cfg.head_dim
    qkv_sizes = [
        hf_cfg.num_attention_heads * head,
        hf_cfg.num_key_value_heads * head,
        hf_cfg.num_key_value_heads * head,
    ]
    kv_scales = {}
    for i in range(hf_cfg.num_hidden_layers):
        p, hp = f"transformer.layers.{i}.", f"model.layers.{i}."
        state[hp + "input_layernorm.weight"] = t.pop(p + "input_layernorm.weight")
        state[hp + "post_attention_layernorm.weight"] = t.pop(p + "post_layernorm.weight")
        linears: dict[str, dict[str, Any]] = {}
        for trt, hf in _HF_NAMES.items():
            linears[hf] = {
                k: t.pop(f"{p}{trt}.{k}", None)
                for k in (
                    "weight",
                    "bias",
                    "weights_scaling_factor",
                    "weights_scaling_factor_2",
                    "activation_scaling_factor",
                    "prequant_scaling_factor",
                )
            }
        fused = {
            k: t.pop(f"{p}attention.qkv.{k}", None)
            for k in (
                "weight",
                "bias",
                "weights_scaling_factor",
                "weights_scaling_factor_2",
                "activation_scaling_factor",
                "prequant_scaling_factor",
            )
        }
        parts = {
            k: _split_rows(v, qkv_sizes) if k in ("weight", "bias", "weights_scaling_factor") else [v] * 3
            for k, v in fused.items()
        }
        for j, hf in enumerate(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")):
            linears[hf] = {k: v[j] for k, v in parts.items()}
        for hf, d in linears.items():
            if algo and d["weights_scaling_factor"] is not None:
                w = dequantize_weight(
                    algo, d["weight"], d["weights_scaling_factor"], d["weights_scaling_factor_2"], name=hp + hf
                )
                a = d["activation_scaling_factor"]
                amax = a.float() * (FP8_MAX if algo in ("FP8", "W4A8_AWQ") else 127.0) if a is not None else None
                set_submodule(
                    model,
                    hp + hf,
                    QuantLinear(
                        w.to(torch_dtype),
                        d["bias"],
                        algo=algo,
                        input_amax=amax,
                        pre_quant_scale=d["prequant_scaling_factor"],
                    ),
                )
            else:
                state[hp + hf + ".weight"] = d["weight"]
                if d["bias"] is not None:
                    state[hp + hf + ".bias"] = d["bias"]
        kv = t.pop(p + "attention.kv_cache_scaling_factor", None)
        k_sf = t.pop(p + "attention.k_cache_scaling_factor", kv)  # ModelOpt writes both spellings
        v_sf = t.pop(p + "attention.v_cache_scaling_factor", kv)
        if k_sf is not None and v_sf is not None and kv_algo:
            bound = FP8_MAX if kv_algo == "FP8" else 127.0
            kv_scales[hp + "self_attn"] = (str(kv_algo), k_sf.float() * bound, v_sf.float() * bound)
    if t:
        raise ModelLoadError(f"{ckpt_dir}: unexpected tensors {sorted(t)[:3]}", hint="not a llama TRT-LLM checkpoint?")
    state = {k: v.to(torch_dtype) for k, v in state.items()}
    result = model.load_state_dict(state, strict=False, assign=True)
    if hf_cfg.tie_word_embeddings:
        model.tie_weights()
    enable_kv_fake_quant(model, kv_scales)
    del result
    return model.eval()
