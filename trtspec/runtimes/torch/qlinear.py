"""The arithmetic of ModelOpt-quantized layers in plain PyTorch: dequantize packed weights, fake-quantize activations.

A checkpoint exported by ModelOpt stores quantized weights (FP8, INT8, packed INT4) with ``*_scale`` tensors beside
them. Loaded naively the scales are ignored and the model is garbage; :class:`QuantLinear` applies them, and fake-
quantizes inputs (and, through :func:`enable_kv_fake_quant`, the KV cache) the way ModelOpt's own quantizers do, so
the loaded model computes what the calibrated model computed. The formulas follow modelopt.torch.quantization
(tensor_quant._fp8_eager, _tensor_quant) and modelopt.torch.export.quant_utils (to_quantized_weight,
pack_int4_in_uint8) of nvidia-modelopt 0.47.
"""

from __future__ import annotations

import sys
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from trtspec.build.formats import TORCH_ACTIVATION_KIND as ACTIVATION_KIND
from trtspec.build.formats import TORCH_SUPPORTED_ALGOS as SUPPORTED_ALGOS
from trtspec.errors import QuantizationError

FP8_MAX = 448.0
_EPS = 1.0 / (1 << 24)


def fake_quant_fp8(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 quantize-dequantize with a per-tensor (or broadcastable) amax, as ModelOpt's ``_fp8_eager``."""
    dtype = x.dtype
    amax = amax.to(torch.float32)
    amax = torch.where(amax <= _EPS, torch.ones_like(amax), amax)
    scale = FP8_MAX / amax
    y = (x.to(torch.float32) * scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (y.to(torch.float32) * (1 / scale)).to(dtype)


def fake_quant_int(x: torch.Tensor, amax: torch.Tensor, num_bits: int = 8) -> torch.Tensor:
    """Symmetric narrow-range integer quantize-dequantize, as ModelOpt's ``_tensor_quant``."""
    dtype = x.dtype
    bound = float(2 ** (num_bits - 1) - 1)
    amax = amax.to(torch.float32)
    scale = bound / torch.where(amax <= _EPS, torch.ones_like(amax), amax)
    y = torch.clamp((x.to(torch.float32) * scale).round(), -bound, bound)
    return (y / scale).to(dtype)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """ModelOpt's packed INT4 [out/2, in] (uint8 or int8 bytes; rows 2r, 2r+1 in the low, high nibble) -> int8
    [out, in]."""
    b = packed.view(torch.uint8).to(torch.int16)
    low, high = b & 0x0F, (b >> 4) & 0x0F
    low = torch.where(low >= 8, low - 16, low)
    high = torch.where(high >= 8, high - 16, high)
    return torch.stack([low, high], dim=1).reshape(b.shape[0] * 2, b.shape[1]).to(torch.int8)


def _per_row(scale: torch.Tensor, rows: int) -> torch.Tensor:
    scale = scale.to(torch.float32)
    return scale.reshape(-1, 1) if scale.numel() == rows else scale.reshape(())


def dequantize_weight(
    algo: str,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor | None = None,
    *,
    name: str = "",
) -> torch.Tensor:
    """A quantized weight and its scales -> the float32 weight the calibrated model computed with."""
    if algo == "FP8":
        w = weight.view(torch.float8_e4m3fn) if weight.dtype in (torch.uint8, torch.int8) else weight
        return w.to(torch.float32) * _per_row(weight_scale, w.shape[0])
    if algo in ("W8A8_SQ_PER_CHANNEL", "W8A16"):
        return weight.to(torch.float32) * _per_row(weight_scale, weight.shape[0])
    if algo in ("W4A16_AWQ", "W4A8_AWQ"):
        q = unpack_int4(weight).to(torch.float32)
        scale = weight_scale.to(torch.float32).reshape(q.shape[0], -1)
        block = q.shape[1] // scale.shape[1]
        w = q * scale.repeat_interleave(block, dim=1)
        if algo == "W4A8_AWQ":
            if weight_scale_2 is None:
                raise QuantizationError(
                    f"{name}: W4A8_AWQ weight without weight_scale_2",
                    hint="re-export the checkpoint with trtspec quantize",
                )
            # ModelOpt's W4A8 weight quantizer is INT4 blocks followed by a per-tensor FP8 quantizer.
            w = fake_quant_fp8(w, weight_scale_2.to(torch.float32).reshape(()) * FP8_MAX)
        return w
    raise QuantizationError(
        f"{name}: quantization {algo} cannot run in the torch runtime",
        hint=f"the torch runtime runs {', '.join(SUPPORTED_ALGOS)}; serve {algo} with TensorRT-LLM",
    )


class QuantLinear(nn.Module):
    """A linear layer running a quantized checkpoint's arithmetic: pre-quant scale, input fake-quant, dequantized
    weight."""

    input_amax: torch.Tensor | None  # buffers (register_buffer)
    pre_quant_scale: torch.Tensor | None

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        algo: str,
        input_amax: torch.Tensor | None = None,
        pre_quant_scale: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.algo = algo
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.input_kind = ACTIVATION_KIND.get(algo) if input_amax is not None else None
        self.register_buffer("input_amax", input_amax.to(torch.float32).reshape(()) if input_amax is not None else None)
        self.register_buffer(
            "pre_quant_scale", pre_quant_scale.to(weight.dtype) if pre_quant_scale is not None else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_quant_scale is not None:  # AWQ / SmoothQuant: part of ModelOpt's input quantizer
            x = x * self.pre_quant_scale
        amax = cast(torch.Tensor, self.input_amax)  # input_kind is set only with an input_amax
        if self.input_kind == "fp8":
            x = fake_quant_fp8(x, amax)
        elif self.input_kind == "int8":
            x = fake_quant_int(x, amax)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, algo={self.algo}, "
            f"activations={self.input_kind or 'unquantized'}"
        )


def set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the submodule at dotted ``name``."""
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, module)


# -- KV cache ----------------------------------------------------------------------------------------------------
KV_ATTENTION_PREFIX = "trtspec_kv_fake_quant_"


def _kv_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> Any:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    kind = getattr(module, "_trtspec_kv_kind", None)
    base = getattr(module, "_trtspec_base_attention", "sdpa")
    if kind is not None:
        fq = fake_quant_fp8 if kind == "FP8" else fake_quant_int
        # As ModelOpt's k/v_bmm_quantizer: applied to the full key/value states after RoPE and the cache update.
        key, value = fq(key, module.trtspec_k_amax), fq(value, module.trtspec_v_amax)
    if base == "eager":
        fn = sys.modules[type(module).__module__].eager_attention_forward
    else:
        fn = ALL_ATTENTION_FUNCTIONS[base]
    return fn(module, query, key, value, attention_mask, **kwargs)


def enable_kv_fake_quant(model: Any, scales: dict[str, tuple[str, torch.Tensor, torch.Tensor]]) -> None:
    """Fake-quantize the KV cache of the attention modules named in ``scales`` ({name: (kind, k_amax, v_amax)}).

    Registers an attention function ``trtspec_kv_fake_quant_<base>`` in transformers' AttentionInterface that quantizes
    keys and values, then calls the model's previous implementation ``<base>`` (sdpa or eager); the same name is
    registered with ``<base>``'s mask builder, without which transformers would build no causal mask at all for a
    custom implementation (and SDPA's ``is_causal`` is wrong for several new tokens over a cache).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if not scales:
        return
    base = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if base.startswith(KV_ATTENTION_PREFIX):
        base = base[len(KV_ATTENTION_PREFIX) :]
    if base not in ("sdpa", "eager"):
        base = "sdpa"  # flash/flex kernels take no fake-quantized inputs we could check on a CPU; SDPA is exact
    name = KV_ATTENTION_PREFIX + base
    AttentionInterface.register(name, _kv_attention)  # idempotent: same name, same function
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    for module_name, (kind, k_amax, v_amax) in scales.items():
        attn: Any = model.get_submodule(module_name)  # an attention module, given trtspec attributes
        attn._trtspec_kv_kind = kind
        attn._trtspec_base_attention = base
        # Buffers, so that model.to(device) moves them; not persistent, so state_dict() is the checkpoint's.
        attn.register_buffer("trtspec_k_amax", k_amax.to(torch.float32).reshape(()), persistent=False)
        attn.register_buffer("trtspec_v_amax", v_amax.to(torch.float32).reshape(()), persistent=False)
    model.set_attn_implementation(name)
