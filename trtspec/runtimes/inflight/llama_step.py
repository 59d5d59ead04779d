"""The packed forward pass of a Llama-family model written as a few fused torch ops per layer: the fast CPU step.

Same inputs and outputs as the transformers path in ``packed`` (one pass over every sequence's new tokens, keys and
values written into the slot KV cache, attention per sequence with ``scaled_dot_product_attention``), without the
module tree around each op. Profiled on SmolLM2-135M (2 cores, fp32), a decode step spent about a third of its time
outside the matrix multiplies (views, transposes, dtype round trips, per-projection calls, mask logic), and those
multiplies read q/k/v and gate/up as five separate weights. Here:

- q, k and v are one matrix multiply, gate and up another (the model's own parameters become views of the fused
  weights: no second copy, and the transformers path keeps working on the same memory);
- rotary cos/sin come from a table of the model's own ``rotary_emb`` values (grown on demand, no per-step math);
- RMSNorm is transformers' own formula in four ops, residual adds are in place;
- keys/values go straight into the slot (layout [slots, kv_heads, capacity, head_dim]: the view SDPA reads, no copy);
- fp32 weights are also pre-packed for MKL at given row counts (``pack_rows``, default 1 and K + 1: the decode step
  and a verification), which MKL multiplies much faster than the plain layout (measured here: 5 rows 1.3x, 1 row
  1.2x); each row count costs one more copy of the weights (SmolLM2-135M: the step with rows 1 and 5 adds about
  1.3 GB of resident memory to the model's 0.5 GB, measured).

Only plain Llama-style decoders qualify (:func:`supports`): silu MLP, no sliding window, no per-head norms, plain RoPE
variants that depend on the position only. Anything else keeps the transformers path. Greedy output is the same
function of the weights up to float rounding (fused multiplies round like the separate ones on MKL; the tests
compare against transformers' own ``generate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from trtspec.runtimes.inflight.kv_pool import SlotKVPool

DEFAULT_PACK_ROWS = (1, 5)  # a decode step, and a verification of K = 4 (the default draft length) + 1 tokens

# transformers classes whose decoder layers are exactly: norm, attention (q/k/v/o, RoPE), residual, norm, silu MLP
_CLASSES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})
_ROPE_TYPES = frozenset({"default", "linear", "llama3"})  # functions of the position alone (not of the length)


def _rope_type(config: Any) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def supports(model: Any) -> bool:
    """Whether ``model``'s forward is the plain Llama decoder that :class:`LlamaStep` reproduces."""
    if type(model).__name__ not in _CLASSES:
        return False
    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu" or _rope_type(cfg) not in _ROPE_TYPES:
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers or not hasattr(model.model, "rotary_emb"):
        return False
    attn = layers[0].self_attn
    return not (hasattr(attn, "q_norm") or hasattr(attn, "k_norm"))


class _Linear:
    """y = x W^T + b with W contiguous, and MKL-packed copies of W for the row counts in ``pack_rows``: x with fewer
    rows than a packed count is zero-padded to it (a memory-bound multiply costs about the same for up to K + 1 rows,
    and MKL's packed kernel is much faster than its plain one there), more rows than any use the plain layout."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack_rows: Sequence[int]) -> None:
        self.weight = weight
        self.bias = bias
        self.packed: dict[int, torch.Tensor] = {}
        if weight.dtype == torch.float32 and weight.device.type == "cpu" and torch._C.has_mkl:
            for rows in sorted(set(pack_rows)):
                self.packed[rows] = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        for rows, packed in self.packed.items():  # ascending
            if t == rows:
                return torch.ops.mkl._mkl_linear(x, packed, self.weight, self.bias, rows)
            if t < rows:
                return torch.ops.mkl._mkl_linear(F.pad(x, (0, 0, 0, rows - t)), packed, self.weight, self.bias, rows)[
                    :t
                ]
        return F.linear(x, self.weight, self.bias)


def _fuse(modules: Sequence[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One [sum(out), in] weight for several linears on the same input; their parameters become views of it."""
    weight = torch.cat([m.weight.detach() for m in modules])
    biases = [m.bias for m in modules]
    bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
    if any(b is not None for b in biases) and bias is None:
        raise ValueError("cannot fuse linears of which only some have a bias")
    start = 0
    for m in modules:
        n = m.weight.shape[0]
        m.weight.data = weight[start : start + n]
        if bias is not None:
            m.bias.data = bias[start : start + n]
        start += n
    return weight, bias


class _Layer:
    def __init__(self, layer: Any, pack_rows: Sequence[int]) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = _Linear(*_fuse([attn.q_proj, attn.k_proj, attn.v_proj]), pack_rows)
        self.o = _Linear(attn.o_proj.weight.detach(), _detached(attn.o_proj.bias), pack_rows)
        self.gate_up = _Linear(*_fuse([mlp.gate_proj, mlp.up_proj]), pack_rows)
        self.down = _Linear(mlp.down_proj.weight.detach(), _detached(mlp.down_proj.bias), pack_rows)
        self.norm1 = layer.input_layernorm.weight.detach()
        self.norm2 = layer.post_attention_layernorm.weight.detach()
        self.intermediate = int(mlp.gate_proj.weight.shape[0])


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


class LlamaStep:
    """The fast packed forward of one supported model (see module docstring); build once per model."""

    def __init__(self, model: Any, pack_rows: Sequence[int] = DEFAULT_PACK_ROWS) -> None:
        cfg = model.config
        self.model = model
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.eps = float(cfg.rms_norm_eps)
        self.scaling = self.head_dim**-0.5
        self.embed = model.model.embed_tokens.weight.detach()
        self.final_norm = model.model.norm.weight.detach()
        self.layers = [_Layer(layer, pack_rows) for layer in model.model.layers]
        self.pack_rows = tuple(pack_rows)
        lm_head = getattr(model, "lm_head", None)
        # The vocabulary head, packed for one row (decide() applies it row set by row set, mostly one row at a time).
        self.head = (
            _Linear(lm_head.weight.detach(), _detached(lm_head.bias), (1,))
            if type(lm_head) is torch.nn.Linear
            else None
        )
        self._cos = self._sin = torch.empty(0)

    def _rotary(self, positions: torch.Tensor, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, D] at ``positions`` from a table of the model's own rotary values."""
        if upto > self._cos.shape[0]:
            n = max(upto, 2 * self._cos.shape[0], 256)
            ref = self.embed[:1].unsqueeze(0)
            cos, sin = self.model.model.rotary_emb(ref, torch.arange(n, device=ref.device).unsqueeze(0))
            self._cos, self._sin = cos[0].contiguous(), sin[0].contiguous()
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """transformers' LlamaRMSNorm, op for op (torch's fused rms_norm was slower here on a CPU)."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def body(
        self, pool: SlotKVPool, segments: Sequence[tuple[int, int, int, int]], ids: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        """Final-norm hidden states [T, hidden] of the packed tokens ``ids`` at positions ``pos``; ``segments`` =
        [(slot, past, start, count)]. Writes each segment's keys/values into its slot."""
        hq, hk, d = self.heads, self.kv_heads, self.head_dim
        gqa = hq != hk
        upto = max(past + count for _, past, _, count in segments)
        cos, sin = self._rotary(pos, upto)
        masks = [
            None if n == 1 else torch.ones(n, p + n, dtype=torch.bool, device=ids.device).tril(diagonal=p)
            for _, p, _, n in segments
        ]
        # Through the module (one call a step): forward hooks on the embeddings still see every pass's [1, T] ids.
        h = self.model.model.embed_tokens(ids.unsqueeze(0))[0]
        t = h.shape[0]
        for i, layer in enumerate(self.layers):
            x = self._norm(h, layer.norm1)
            qkv = layer.qkv(x)
            q = self._rope(qkv[:, : hq * d].view(t, hq, d), cos, sin)
            k = self._rope(qkv[:, hq * d : (hq + hk) * d].view(t, hk, d), cos, sin)
            v = qkv[:, (hq + hk) * d :].view(t, hk, d)
            keys, values = pool.keys[i], pool.values[i]
            out = torch.empty(t, hq, d, dtype=h.dtype, device=h.device) if len(segments) > 1 else None
            for (slot, past, a, n), mask in zip(segments, masks):
                keys[slot, :, past : past + n] = k[a : a + n].transpose(0, 1)
                values[slot, :, past : past + n] = v[a : a + n].transpose(0, 1)
                o = F.scaled_dot_product_attention(
                    q[a : a + n].transpose(0, 1).unsqueeze(0),
                    keys[slot : slot + 1, :, : past + n],
                    values[slot : slot + 1, :, : past + n],
                    attn_mask=mask,
                    scale=self.scaling,
                    enable_gqa=gqa,
                )[0].transpose(0, 1)
                if out is None:
                    out = o
                else:
                    out[a : a + n] = o
            assert out is not None
            h += layer.o(out.reshape(t, hq * d))
            x = self._norm(h, layer.norm2)
            gu = layer.gate_up(x)
            h += layer.down(F.silu(gu[:, : layer.intermediate]) * gu[:, layer.intermediate :])
        return self._norm(h, self.final_norm)


def step_of(model: Any, pack_rows: Sequence[int] = DEFAULT_PACK_ROWS) -> LlamaStep | None:
    """The model's :class:`LlamaStep` (built on first use and kept on the model), or None when it is not supported."""
    step = model.__dict__.get("_trtspec_llama_step")
    if step is None or step.pack_rows != tuple(pack_rows):
        if not supports(model):
            return None
        step = LlamaStep(model, pack_rows)
        model.__dict__["_trtspec_llama_step"] = step
    return step
