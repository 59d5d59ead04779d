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
- float32 weights are also pre-packed, once, in oneDNN's blocked layout, which multiplies the few rows of a decode
  step or a verification much faster than MKL's plain or packed kernels (measured on a 2-core AMD EPYC with AVX2:
  5 rows cost 1.3x one row against 1.7x with MKL's packed copies, 1 row 10 % less); one copy for every row count
  (SmolLM2-135M: 0.5 GB beside the model's 0.5 GB). Without oneDNN, MKL-packed copies for ``pack_rows`` (default 1
  and K + 1), one copy per row count. Where trtspec's own kernels run (:mod:`cpu_kernels`: x86-64 with AVX2 and FMA),
  passes of up to ``cpu_kernels.MAX_ROWS`` rows multiply by the plain weights through them instead (each row's bits
  independent of the pass), and the residual add with the next norm, the rotary embedding and the MLP's activation
  are one kernel call each (2-core AMD EPYC: a one-token pass 59 -> 38 ms).

bfloat16 weights on a CPU take another path, built so that every row of a pass gets the bits it would get alone
(``row_invariant``): oneDNN multiplies on pre-packed weights, split at INVARIANT_REDUCTION inputs (both in
:mod:`linear`), and attention as two batched multiplies per kv head with a float32 softmax (:mod:`row_attention`;
the keys too split at INVARIANT_REDUCTION), on one thread for small passes, the decoding and verification rows of
several sequences in one such call per layer (``BatchedSegments``, ``batched_row_attention``).
So verification of K + 1 tokens, batched or not, equals K + 1 decode steps bit for bit, and it costs about one step
(measured on SmolLM2-135M, 2 cores: v = 1.03 against 1.6-2.0 on the float32 path; benchmarks/cpu_runtime.py --bf16).
Where trtspec's kernels run, bfloat16 goes through them instead, as row-invariant and faster: the bfloat16 multiply at
every row count on the plain weights (no packed copies), the elementwise kernels, and the attention kernel for every
segment (a 2-core AMD EPYC with AVX512-BF16: 46.6 -> 29.9 ms per target-only token). Where every kernel of a pass is
trtspec's (bfloat16: every pass; float32: passes of at most ``cpu_kernels.MAX_ROWS`` tokens in short segments), the
pass runs through every layer in one call (``cpu_kernels.whole_pass``): measured side by side in one process,
target-only 1.18x the tokens per second of the same kernels called from Python, n-grams 1.14x, the draft model 1.14x
in bfloat16, 1.19x / 1.14x / 1.12x in float32 (``benchmarks/cpu_switches.py whole-pass``).

Only plain Llama-style decoders qualify (:func:`supports`): silu MLP, no sliding window, no per-head norms, plain RoPE
variants that depend on the position only. Anything else keeps the transformers path. Greedy output is the same
function of the weights up to float rounding (fused multiplies round like the separate ones on MKL; the tests
compare against transformers' own ``generate``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from trtspec.runtimes.inflight import cpu_kernels
from trtspec.runtimes.inflight.kv_pool import SlotKVPool
from trtspec.runtimes.inflight.linear import Linear, fuse, row_invariant
from trtspec.runtimes.inflight.row_attention import BatchedSegments, batched_row_attention, row_attention

DEFAULT_PACK_ROWS = (1, 5)  # a decode step, and a verification of K = 4 (the default draft length) + 1 tokens
SMALL_PASS = 64  # passes of at most this many tokens (decoding, verification) attend on one thread

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


class _Layer:
    def __init__(self, layer: Any, pack_rows: Sequence[int]) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv = Linear(*fuse([attn.q_proj, attn.k_proj, attn.v_proj]), pack_rows)
        self.o = Linear(attn.o_proj.weight.detach(), _detached(attn.o_proj.bias), pack_rows)
        self.gate_up = Linear(*fuse([mlp.gate_proj, mlp.up_proj]), pack_rows)
        self.down = Linear(mlp.down_proj.weight.detach(), _detached(mlp.down_proj.bias), pack_rows)
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
        self.invariant = row_invariant(self.embed)
        # float32 or bfloat16 on a CPU where trtspec's kernels run: the residual add with the next norm, the rotary
        # embedding and the MLP's activation each one call per layer (cpu_kernels), not four to six torch ops
        self.elementwise = (
            self.embed.dtype in (torch.float32, torch.bfloat16)
            and self.embed.device.type == "cpu"
            and cpu_kernels.available()
        )
        # and the short segments' attention (decoding, verification) in one kernel call per layer; in bfloat16 every
        # segment's (faster than row_attention at every length measured, 16-1000 tokens, and one path for every
        # row: a draft token verified in the prefill's pass gets the bits a decode pass would give it)
        self.attend_kernel = self.elementwise and self.head_dim % 8 == 0 and self.head_dim <= cpu_kernels.ATTEND_DIM
        self.attend_every = self.attend_kernel and self.embed.dtype == torch.bfloat16
        self._segs: tuple[Sequence[tuple[int, int, int, int]], torch.Tensor] | None = None
        self.final_norm = model.model.norm.weight.detach()
        self.layers = [_Layer(layer, pack_rows) for layer in model.model.layers]
        self.pack_rows = tuple(pack_rows)
        lm_head = getattr(model, "lm_head", None)
        # The vocabulary head, packed for one row (decide() applies it row set by row set, mostly one row at a time).
        self.head = (
            Linear(lm_head.weight.detach(), _detached(lm_head.bias), (1,)) if type(lm_head) is torch.nn.Linear else None
        )
        self._cos = self._sin = torch.empty(0)
        # Where every kernel of a pass is trtspec's (bfloat16: every pass; float32: passes of at most MAX_ROWS tokens
        # in short segments), the whole pass in one call (cpu_kernels.whole_pass): the per-layer loop in C rather
        # than 9 Python calls per layer, the same kernels and bits. Tests turn it off to compare the two paths.
        self.whole_pass = (
            self.elementwise
            and self.attend_kernel
            and all(lin.small for layer in self.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
        )
        # The whole pass's threads in one OpenMP region, each step dealt between them (cpu_kernels.pass_team), rather
        # than each kernel with its own region and thread count. Benchmarks turn it off to compare the two.
        self.one_region = True
        # per KV pool (engines on one model have their own; a table lives as long as its pool)
        self._tables: weakref.WeakKeyDictionary[SlotKVPool, tuple[torch.Tensor, list[torch.Tensor]]] = (
            weakref.WeakKeyDictionary()
        )

    def _rotary(self, positions: torch.Tensor, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, D] at ``positions`` from a table of the model's own rotary values."""
        if upto > self._cos.shape[0]:
            n = max(upto, 2 * self._cos.shape[0], 256)
            ref = self.embed[:1].unsqueeze(0)
            cos, sin = self.model.model.rotary_emb(ref, torch.arange(n, device=ref.device).unsqueeze(0))
            self._cos, self._sin = cos[0].contiguous(), sin[0].contiguous()
        return self._cos[positions].unsqueeze(1), self._sin[positions].unsqueeze(1)

    def _segments(self, segments: Sequence[tuple[int, int, int, int]]) -> torch.Tensor:
        """``segments`` as the [S, 4] int64 tensor the attention kernel reads, made once per pass (30 layers)."""
        if self._segs is None or self._segs[0] is not segments:
            self._segs = (segments, torch.tensor(segments, dtype=torch.int64).view(-1, 4))
        return self._segs[1]

    def _pass_table(self, pool: SlotKVPool) -> torch.Tensor:
        """The layers' addresses for cpu_kernels.whole_pass with ``pool``'s caches (made once per pool; a bias
        converted to the weights' dtype is kept with it, the other tensors are the model's and the pool's own)."""
        table = self._tables.get(pool)
        if table is None:
            keep: list[torch.Tensor] = []

            def address(t: torch.Tensor | None) -> int:
                if t is None:
                    return 0
                if t.dtype != self.embed.dtype or not t.is_contiguous():  # a bias as cpu_kernels.linear takes it
                    t = t.to(self.embed.dtype).contiguous()
                    keep.append(t)
                return int(t.data_ptr())

            rows = []
            for i, layer in enumerate(self.layers):
                slots = {
                    "norm1": layer.norm1,
                    "qkv": layer.qkv.weight,
                    "qkv_bias": layer.qkv.bias,
                    "o": layer.o.weight,
                    "o_bias": layer.o.bias,
                    "norm2": layer.norm2,
                    "gate_up": layer.gate_up.weight,
                    "gate_up_bias": layer.gate_up.bias,
                    "down": layer.down.weight,
                    "down_bias": layer.down.bias,
                    "keys": pool.keys[i],
                    "values": pool.values[i],
                }
                rows.append([address(slots[name]) for name in cpu_kernels.PASS_SLOTS])
            table = self._tables[pool] = (torch.tensor(rows, dtype=torch.int64), keep)
        return table[0]

    def _whole_pass(
        self,
        pool: SlotKVPool,
        segments: Sequence[tuple[int, int, int, int]],
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """:meth:`body` through cpu_kernels.whole_pass: torch's threads in one region (:attr:`one_region`), else the
        thread counts each kernel call would take from Python."""
        t, d = h.shape[0], self.head_dim
        layer = self.layers[0]
        team = cpu_kernels.pass_team() if self.one_region else 1
        threads = (  # each kernel's own threads: read only by a pass without a team
            [
                cpu_kernels.threads_for(t, h.dtype, lin.weight.numel())
                for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
            ]
            + [cpu_kernels.threads_for(t, h.dtype)]
            if team == 1
            else [1] * 5
        )
        geometry = (self.heads, self.kv_heads, d, layer.intermediate, int(pool.keys[0].shape[2]))
        return cpu_kernels.whole_pass(
            h,
            self._pass_table(pool),
            self.final_norm,
            cos.view(t, d),
            sin.view(t, d),
            self._segments(segments),
            geometry,
            self.eps,
            self.scaling,
            threads,
            team,
        )

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """transformers' LlamaRMSNorm, op for op (torch's fused rms_norm was slower here on a CPU)."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def _attend(
        self,
        pool: SlotKVPool,
        layer: int,
        segments: Sequence[tuple[int, int, int, int]],
        masks: Sequence[torch.Tensor | None],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batched: BatchedSegments | None = None,
        kernel: Sequence[tuple[int, int, int, int]] = (),
    ) -> torch.Tensor:
        """Write each segment's keys/values into its slot and attend its queries over the slot: [T, heads, d].
        ``batched``: the short segments at once (see BatchedSegments); the others one by one. ``kernel``: the segments
        (all of them, or the short ones of a pass with a prefill) that trtspec's attention kernel takes in one call
        (cpu_kernels.attend); the others as above."""
        keys, values = pool.keys[layer], pool.values[layer]
        out = torch.empty_like(q) if len(segments) > 1 else None
        if kernel:
            out = cpu_kernels.attend(q, k, v, keys, values, self._segments(kernel), self.scaling)
            if len(kernel) == len(segments):
                return out
        taken = {(slot, past) for slot, past, _, _ in kernel}
        if batched is not None:
            assert out is not None
            b = batched
            keys[b.slot_t, :, b.pos_t] = k[b.src]
            values[b.slot_t, :, b.pos_t] = v[b.src]
            qp = q.new_zeros(b.rows, b.width, q.shape[1], q.shape[2])
            qp[b.row_i, b.query_i] = q[b.src]
            view_k = keys[b.lo : b.lo + b.rows, :, : b.length]
            view_v = values[b.lo : b.lo + b.rows, :, : b.length]
            if b.hidden is not None:
                o = batched_row_attention(qp, view_k, view_v, b.hidden, self.scaling)
            else:
                o = F.scaled_dot_product_attention(
                    qp.transpose(1, 2),
                    view_k,
                    view_v,
                    attn_mask=b.mask,
                    scale=self.scaling,
                    enable_gqa=self.heads != self.kv_heads,
                ).transpose(1, 2)
            out[b.src] = o[b.row_i, b.query_i]
        for j, ((slot, past, a, n), mask) in enumerate(zip(segments, masks)):
            if (batched is not None and j in batched.members) or (slot, past) in taken:
                continue
            keys[slot, :, past : past + n] = k[a : a + n].transpose(0, 1)
            values[slot, :, past : past + n] = v[a : a + n].transpose(0, 1)
            if self.invariant:
                o = row_attention(
                    q[a : a + n], keys[slot, :, : past + n], values[slot, :, : past + n], past, self.scaling
                )
            else:
                o = F.scaled_dot_product_attention(
                    q[a : a + n].transpose(0, 1).unsqueeze(0),
                    keys[slot : slot + 1, :, : past + n],
                    values[slot : slot + 1, :, : past + n],
                    attn_mask=mask,
                    scale=self.scaling,
                    enable_gqa=self.heads != self.kv_heads,
                )[0].transpose(0, 1)
            if out is None:
                out = o
            else:
                out[a : a + n] = o
        assert out is not None
        return out

    def body(
        self, pool: SlotKVPool, segments: Sequence[tuple[int, int, int, int]], ids: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        """Final-norm hidden states [T, hidden] of the packed tokens ``ids`` at positions ``pos``; ``segments`` =
        [(slot, past, start, count)]. Writes each segment's keys/values into its slot."""
        hq, hk, d = self.heads, self.kv_heads, self.head_dim
        pool.check_segments(segments, len(ids))
        upto = max(past + count for _, past, _, count in segments)
        cos, sin = self._rotary(pos, upto)
        # The short segments (decoding, verification) attend through the kernel in one call, a prefill's beside them
        # as before: a short segment's rows get the same bits in a pass with a prefill as without one.
        limit = max(seg[3] for seg in segments) if self.attend_every else cpu_kernels.ATTEND_ROWS
        short = [seg for seg in segments if seg[3] <= limit] if self.attend_kernel else []
        attend_all = len(short) == len(segments)
        # Through the module (one call a step): forward hooks on the embeddings still see every pass's [1, T] ids.
        h = self.model.model.embed_tokens(ids.unsqueeze(0))[0]
        if (
            self.whole_pass
            and attend_all
            and (self.attend_every or len(ids) <= cpu_kernels.MAX_ROWS)
            and pool.keys[0].dtype == self.embed.dtype  # the kernels write the caches in the weights' dtype
        ):
            return self._whole_pass(pool, segments, h.contiguous(), cos, sin)
        masks = [
            None
            if n == 1 or self.invariant or (short and n <= limit)
            else torch.ones(n, p + n, dtype=torch.bool, device=ids.device).tril(diagonal=p)
            for _, p, _, n in segments
        ]
        batched = None
        if short:  # the kernel takes the short segments in one call: no masks, no batched view
            pass
        elif self.invariant:  # each row's bits as alone (see batched_row_attention)
            batched = BatchedSegments.of(segments, ids.device, hq // hk)
        elif self.embed.dtype == torch.float32:
            batched = BatchedSegments.of(segments, ids.device)
        if batched is not None:
            batched.prepare(pool, segments)
        t = h.shape[0]
        # A decode or verification pass's attention is a few tiny multiplies per layer: waking OpenMP's second thread
        # for each costs more than it saves under the passive wait (trtspec.threads). Measured (bfloat16, 9 heads of
        # 64, 200 cached tokens): 365 -> 140 us per layer, the same bits (the test checks rows against 2 threads).
        threads = torch.get_num_threads()
        one_thread = self.invariant and not attend_all and threads > 1 and t <= SMALL_PASS
        elementwise = self.elementwise and h.is_contiguous()
        delta: torch.Tensor | None = None  # the residual the kernels add with the next norm
        for i, layer in enumerate(self.layers):
            if elementwise:
                x = cpu_kernels.add_rmsnorm(h, delta, layer.norm1, self.eps)
                qkv = layer.qkv(x)
                cpu_kernels.rope_(qkv, cos.view(t, d), sin.view(t, d), hq + hk, d)
                q, k = qkv[:, : hq * d].view(t, hq, d), qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
            else:
                x = self._norm(h, layer.norm1)
                qkv = layer.qkv(x)
                q = self._rope(qkv[:, : hq * d].view(t, hq, d), cos, sin)
                k = self._rope(qkv[:, hq * d : (hq + hk) * d].view(t, hk, d), cos, sin)
            v = qkv[:, (hq + hk) * d :].view(t, hk, d)
            if one_thread:
                torch.set_num_threads(1)
            try:
                out = self._attend(pool, i, segments, masks, q, k, v, batched, short)
            finally:
                if one_thread:
                    torch.set_num_threads(threads)
            if elementwise:
                x = cpu_kernels.add_rmsnorm(h, layer.o(out.reshape(t, hq * d)), layer.norm2, self.eps)
                delta = layer.down(cpu_kernels.silu_mul(layer.gate_up(x), layer.intermediate))
                continue
            h += layer.o(out.reshape(t, hq * d))
            x = self._norm(h, layer.norm2)
            gu = layer.gate_up(x)
            h += layer.down(F.silu(gu[:, : layer.intermediate]) * gu[:, layer.intermediate :])
        if elementwise:
            return cpu_kernels.add_rmsnorm(h, delta, self.final_norm, self.eps)
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
