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
(:func:`row_invariant`): oneDNN multiplies on pre-packed weights, split at INVARIANT_REDUCTION inputs, and attention
as two batched multiplies per kv head with a float32 softmax (:func:`_row_attention`; the keys too split at
INVARIANT_REDUCTION), on one thread for small passes, the decoding and verification rows of several sequences in one
such call per layer (:class:`_Batched`, :func:`_batched_row_attention`).
So verification of K + 1 tokens, batched or not, equals K + 1 decode steps bit for bit, and it costs about one step
(measured on SmolLM2-135M, 2 cores: v = 1.03 against 1.6-2.0 on the float32 path; benchmarks/cpu_runtime.py --bf16).
Where trtspec's kernels run, bfloat16 goes through them instead, as row-invariant and faster: the bfloat16 multiply at
every row count on the plain weights (no packed copies), the elementwise kernels, and the attention kernel for every
segment (a 2-core AMD EPYC with AVX512-BF16: 46.6 -> 29.9 ms per target-only token).

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

from trtspec.runtimes.inflight import cpu_kernels
from trtspec.runtimes.inflight.kv_pool import SlotKVPool

DEFAULT_PACK_ROWS = (1, 5)  # a decode step, and a verification of K = 4 (the default draft length) + 1 tokens
# oneDNN's bfloat16 matrix multiply on a CPU gives each row the same bits whatever the number of rows when the
# reduction (input) dimension is at most this; longer reductions are split by rows into differently ordered sums
# (measured with torch 2.13 on AVX512-BF16: row results changed from 2-6 rows on at 1088-2048 inputs, never at
# <= 1024 up to 300 rows; tests/test_llama_step.py checks it on the machine that runs the tests).
INVARIANT_REDUCTION = 1024
_ONEDNN_ROWS = 4  # at most the row count float32 weights are packed for (see _Linear)
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


class _Linear:
    """y = x W^T + b on a CPU-friendly copy of W. float32: W in oneDNN's blocked layout (one copy that serves every row
    count; measured on a 2-core AMD EPYC (AVX2), the 30 layers' multiplies of SmolLM2-135M: 23.3 / 24.9 / 30.7 /
    33.2 ms for 1 / 2 / 5 / 8 rows, against 25.6 / 41.1 / 43.3 / 61.5 with MKL's packed kernels and 34.0 / 48.2 /
    50.6 / 54.4 plain), else MKL-packed copies for the row counts in ``pack_rows`` (x with fewer rows than a packed
    count is zero-padded to it; each count is one more copy of W), else the plain layout. bfloat16: the plain W
    through trtspec's bfloat16 kernel at every row count (row-invariant), else with :func:`row_invariant` pieces of at
    most INVARIANT_REDUCTION inputs, each packed for oneDNN."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack_rows: Sequence[int]) -> None:
        self.weight = weight
        self.bias = bias
        self.packed: dict[int, torch.Tensor] = {}
        self.pieces: list[tuple[int, int, torch.Tensor]] = []
        self.onednn: torch.Tensor | None = None
        cpu32 = weight.dtype == torch.float32 and weight.device.type == "cpu"
        # A float32 pass of at most cpu_kernels.MAX_ROWS rows (decoding, verification) multiplies by the plain weight
        # through trtspec's own kernel where it runs (AVX2 + FMA); longer passes (prefill, large batches) take the copy
        # below. bfloat16 passes of every size take trtspec's bfloat16 kernel (cpu_kernels.every_row): no copy.
        self.small = cpu_kernels.applies(weight)
        self.every_row = cpu_kernels.every_row(weight)
        if cpu32 and pack_rows and torch.backends.mkldnn.is_available():
            # Packed for a few rows, within 2-7 % of a copy packed for each count at 1, 2, 5 and 8 rows (measured);
            # a weight used for one row (the vocabulary head: pack_rows (1,)) is packed for one (4.6 against 5.5 ms).
            rows = min(_ONEDNN_ROWS, max(pack_rows))
            self.onednn = _onednn_packed(weight, rows)
        elif cpu32 and torch._C.has_mkl:
            for rows in sorted(set(pack_rows)):
                self.packed[rows] = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        elif row_invariant(weight) and not self.every_row:
            # Pieces of at most INVARIANT_REDUCTION inputs, each pre-packed for oneDNN (the plain layout is reordered
            # on every call: measured 38 -> 27 ms per step's multiplies here, the same bits).
            n = -(-weight.shape[1] // INVARIANT_REDUCTION)
            bounds = [round(i * weight.shape[1] / n) for i in range(n + 1)]
            self.pieces = [(a, b, _onednn_packed(weight[:, a:b].contiguous())) for a, b in zip(bounds, bounds[1:])]

    @property
    def flat_rows(self) -> int:
        """Up to how many rows a multiply costs about what one row does (memory-bound: trtspec's kernel), else 0."""
        return cpu_kernels.MAX_ROWS if self.small else 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.small and (self.every_row or x.shape[0] <= cpu_kernels.MAX_ROWS):
            return cpu_kernels.linear(x, self.weight, self.bias)
        if self.onednn is not None:
            return _onednn_linear(x, self.onednn, self.bias)
        if self.pieces:  # a row's result must not depend on how many rows the pass has (see row_invariant)
            if len(self.pieces) == 1:
                return _onednn_linear(x, self.pieces[0][2], self.bias)
            acc = torch.zeros(x.shape[0], self.weight.shape[0], dtype=torch.float32, device=x.device)
            for a, b, w in self.pieces:
                acc += _onednn_linear(x[:, a:b].contiguous(), w, None).float()
            out = acc.to(x.dtype)
            return out if self.bias is None else out + self.bias
        t = x.shape[0]
        for rows, packed in self.packed.items():  # ascending
            if t == rows:
                return torch.ops.mkl._mkl_linear(x, packed, self.weight, self.bias, rows)
            if t < rows:
                return torch.ops.mkl._mkl_linear(F.pad(x, (0, 0, 0, rows - t)), packed, self.weight, self.bias, rows)[
                    :t
                ]
        return F.linear(x, self.weight, self.bias)


def _onednn_packed(weight: torch.Tensor, rows: int = 1) -> torch.Tensor:
    """``weight`` in oneDNN's blocked layout for multiplies of about ``rows`` rows when this torch has it (else as
    it is)."""
    if torch.backends.mkldnn.is_available():
        return torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    return weight


def _onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if torch.backends.mkldnn.is_available():
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return F.linear(x, packed, bias)


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


def row_invariant(weight: torch.Tensor) -> bool:
    """Whether the step computes with ``weight`` so that every row of a pass gets the bits it would get alone: the
    bfloat16 path on a CPU (multiplies split at INVARIANT_REDUCTION inputs, attention by :func:`_row_attention`). Then
    a verification of K + 1 tokens, batched with other sequences or not, computes exactly what K + 1 decode steps
    would, and greedy speculative output is the target-only output bit for bit. (The float32 path is not: MKL's
    sgemm and scaled_dot_product_attention round differently by row count, rarely enough to flip a greedy token.)"""
    return weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and onednn_bf16()


def onednn_bf16() -> bool:
    """Whether oneDNN multiplies bfloat16 on this CPU (AVX512BW/VL/DQ or AVX-NE-CONVERT). Without it (an AVX2-only
    CPU) bfloat16 weights take the plain path: torch's emulated multiplies, slow and rounded by row count like
    float32's, which is why the example chooses float32 there (trtspec.spec_defaults.cpu_dtype)."""
    global _ONEDNN_BF16
    if _ONEDNN_BF16 is None:
        _ONEDNN_BF16 = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return _ONEDNN_BF16


_ONEDNN_BF16: bool | None = None


def _row_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, scaling: float
) -> torch.Tensor:
    """Causal attention of ``q`` [n, hq, d] (positions past .. past + n - 1) over ``keys``/``values`` [hk, past + n,
    d], each query row computed as it would be alone: two batched multiplies per kv head with a reduction of d and of
    the keys (zero weights past a row's last key add exact zeros; the keys split as in :func:`_weighted_values`), a
    float32 softmax per row. On a CPU in bfloat16 this is also 2-6x faster than scaled_dot_product_attention for one
    query (measured: 67-176 us against 156-1045 us at 10-1500 cached tokens, 9 heads of 64)."""
    n, hq, d = q.shape
    hk, length = keys.shape[0], keys.shape[1]
    g = hq // hk
    qq = q.view(n, hk, g, d).permute(1, 0, 2, 3).reshape(hk, n * g, d)
    scores = torch.bmm(qq, keys.contiguous().transpose(1, 2)).float()  # see _batched_row_attention
    if n > 1:
        last = (past + 1 + torch.arange(n, device=q.device)).repeat_interleave(g)
        scores.masked_fill_(
            torch.arange(length, device=q.device).view(1, 1, length) >= last.view(1, n * g, 1), -torch.inf
        )
    probs = torch.softmax(scores * scaling, -1).to(values.dtype)
    out = _weighted_values(probs, values)  # [hk, n * g, d]
    return out.view(hk, n, g, d).permute(1, 0, 2, 3).reshape(n, hq, d)


def _weighted_values(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``probs`` [B, M, L] x ``values`` [B, L, d], each row's bits independent of M and of zero-weight keys padded
    after its own: over more than INVARIANT_REDUCTION keys, oneDNN's bfloat16 bmm orders a row's sum by the row count
    and the reduction length, as its linear does (measured, torch 2.13, AVX512-BF16: a verification's rows after
    1023 cached tokens, or rows of 800-1000 keys padded to a longer sequence's 1500-2916, differed from the same rows
    alone in about one output in 4 000 to 100 000; not seen in the same trials with every length <= 1024), so the keys
    go in pieces of INVARIANT_REDUCTION from key 0, summed in float32 in order (within a piece a row's bits ignore
    the row count, the padding and the thread count: tests/test_llama_step.py checks it here)."""
    length = probs.shape[-1]
    if length <= INVARIANT_REDUCTION:
        return torch.bmm(probs, values)
    acc = torch.bmm(probs[..., :INVARIANT_REDUCTION], values[:, :INVARIANT_REDUCTION]).float()
    for a in range(INVARIANT_REDUCTION, length, INVARIANT_REDUCTION):
        b = min(length, a + INVARIANT_REDUCTION)
        acc += torch.bmm(probs[..., a:b], values[:, a:b]).float()
    return acc.to(values.dtype)


def _batched_row_attention(
    qp: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor, scaling: float
) -> torch.Tensor:
    """:func:`_row_attention` of several slots at once: ``qp`` [R, W, hq, d] (queries padded to the widest segment),
    ``keys``/``values`` [R, hk, L, d] (every slot's view padded to the longest window, numbers everywhere),
    ``hidden`` [R, 1, W * g, L] True where a query row must not see a key (past its causal window, or padding). The
    same multiplies per row as alone, with zero weights on the padded keys, which add exact zeros; the row count and
    the reduction length do not change a row's bits (the reduction is d, or keys in INVARIANT_REDUCTION pieces from
    key 0: :func:`_weighted_values`). Returns [R, W, hq, d]."""
    r, w, hq, d = qp.shape
    hk, length = keys.shape[1], keys.shape[2]
    g = hq // hk
    qq = qp.view(r, w, hk, g, d).permute(0, 2, 1, 3, 4).reshape(r * hk, w * g, d)
    # A slot's first L keys are no contiguous [hk, L, d] block (its capacity follows), and bmm copies an operand
    # that is neither contiguous nor a transposed contiguous one: the transposed view was copied key by key into
    # [hk, d, L] (measured, 24 heads of 201 x 64: 370 us of a 410 us bmm), the keys copied as they lie and then
    # transposed cost 26 us plus the bmm, with the same bits (both forms compared over 60 shapes).
    keys = keys.flatten(0, 1).contiguous()
    scores = torch.bmm(qq, keys.transpose(1, 2)).float().view(r, hk, w * g, length)
    scores.masked_fill_(hidden, -torch.inf)
    probs = torch.softmax(scores * scaling, -1).to(values.dtype).view(r * hk, w * g, length)
    out = _weighted_values(probs, values.flatten(0, 1))  # [R * hk, W * g, d]
    return out.view(r, hk, w, g, d).permute(0, 2, 1, 3, 4).reshape(r, w, hq, d)


# segments of at most this many tokens (decoding, verification) of several sequences attend in one call per layer
BATCHED_QUERIES = 16


class _Batched:
    """The short segments of a pass (decoding and verification rows of several sequences), attended with one call per
    layer instead of one per sequence (float32: scaled_dot_product_attention; bfloat16 with :func:`row_invariant`:
    :func:`_batched_row_attention`, each row's bits as alone): their slots as one view of the cache
    (``lo`` .. ``lo + rows``, a range that may hold slots of no segment: their rows attend to key 0 and are dropped),
    queries padded to the longest segment, a mask for each one's causal window; keys/values written with one indexed
    copy. Every slot of the view must hold numbers up to the longest window: a masked position is still multiplied
    by its zero weight, and never-written memory can hold NaN (0 x NaN poisoned the example's self-draft, whose
    acceptance fell from 1.0 to 0.02), so ``prepare`` zeroes it once (SlotKVPool.zero_beyond). Measured at 8
    sequences, SmolLM2-135M, float32, 2 cores (AVX2), in process, 64 tokens: attention was a quarter of a step as 240
    calls per step with their Python around them; batched, target-only 81.5 -> 92.7 tok/s, n-gram K4 81.7 -> 88.8.
    bfloat16 (AVX512-BF16, 2 cores, 200 cached tokens each, the engine's passes): a plain step of 8 sequences 155 ->
    119 ms (median; 80 ms for one sequence either way), a K 4 verification of 8 261 -> 225 ms. float32 rows round
    with the batch's padded length (float32 is not row-invariant anyway); the bfloat16 path's rows do not
    (``groups``: query heads per kv head, given for it: ``hidden`` is its mask, one row per query head).
    Built once per pass; None where it does not apply (fewer than two short segments, or slots spread over more than
    twice their number)."""

    def __init__(self, members: dict[int, tuple[int, int, int, int]], device: Any, groups: int = 0) -> None:
        segs = list(members.values())
        self.members = members
        self.lo = min(s for s, _, _, _ in segs)
        self.rows = max(s for s, _, _, _ in segs) - self.lo + 1
        self.width = max(n for _, _, _, n in segs)
        self.length = max(p + n for _, p, _, n in segs)
        src, row_i, query_i, pos = [], [], [], []
        allowed = torch.zeros(self.rows, 1, self.width, self.length, dtype=torch.bool)
        allowed[..., 0] = True  # padded and empty rows: key 0 (their outputs are not read)
        for slot, past, a, n in segs:
            b = slot - self.lo
            for r in range(n):
                src.append(a + r)
                row_i.append(b)
                query_i.append(r)
                pos.append(past + r)
                allowed[b, 0, r, : past + r + 1] = True

        def t(xs: list[int]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.long, device=device)

        self.src, self.row_i, self.query_i, self.pos_t = t(src), t(row_i), t(query_i), t(pos)
        self.slot_t = self.row_i + self.lo
        self.mask = allowed.to(device)
        self.hidden = ~self.mask.repeat_interleave(groups, dim=2) if groups else None

    def prepare(self, pool: SlotKVPool, segments: Sequence[tuple[int, int, int, int]]) -> None:
        """Every slot of the view holds numbers up to the longest window (masked positions are still multiplied):
        never-written memory past each slot's live extent is zeroed (once)."""
        live = {slot: pool.slots[slot].length for slot in range(self.lo, self.lo + self.rows)}
        for slot, past, _, n in segments:
            if slot in live:
                live[slot] = max(live[slot], past + n)
        for slot, end in live.items():
            pool.zero_beyond(slot, end, self.length)

    @classmethod
    def of(cls, segments: Sequence[tuple[int, int, int, int]], device: Any, groups: int = 0) -> _Batched | None:
        members = {j: seg for j, seg in enumerate(segments) if seg[3] <= BATCHED_QUERIES}
        if len(members) < 2:
            return None
        slots = [s for s, _, _, _ in members.values()]
        if max(slots) - min(slots) + 1 > 2 * len(slots):
            return None
        return cls(members, device, groups)


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
        # segment's (faster than _row_attention at every length measured, 16-1000 tokens, and one path for every
        # row: a draft token verified in the prefill's pass gets the bits a decode pass would give it)
        self.attend_kernel = self.elementwise and self.head_dim % 8 == 0
        self.attend_every = self.attend_kernel and self.embed.dtype == torch.bfloat16
        self._segs: tuple[Sequence[tuple[int, int, int, int]], torch.Tensor] | None = None
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

    def _segments(self, segments: Sequence[tuple[int, int, int, int]]) -> torch.Tensor:
        """``segments`` as the [S, 4] int64 tensor the attention kernel reads, made once per pass (30 layers)."""
        if self._segs is None or self._segs[0] is not segments:
            self._segs = (segments, torch.tensor(segments, dtype=torch.int64).view(-1, 4))
        return self._segs[1]

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
        batched: _Batched | None = None,
        kernel: Sequence[tuple[int, int, int, int]] = (),
    ) -> torch.Tensor:
        """Write each segment's keys/values into its slot and attend its queries over the slot: [T, heads, d].
        ``batched``: the short segments at once (see _Batched); the others one by one. ``kernel``: the segments (all
        of them, or the short ones of a pass with a prefill) that trtspec's attention kernel takes in one call
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
                o = _batched_row_attention(qp, view_k, view_v, b.hidden, self.scaling)
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
                o = _row_attention(
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
        upto = max(past + count for _, past, _, count in segments)
        cos, sin = self._rotary(pos, upto)
        # The short segments (decoding, verification) attend through the kernel in one call, a prefill's beside them
        # as before: a short segment's rows get the same bits in a pass with a prefill as without one.
        limit = max(seg[3] for seg in segments) if self.attend_every else cpu_kernels.ATTEND_ROWS
        short = [seg for seg in segments if seg[3] <= limit] if self.attend_kernel else []
        attend_all = len(short) == len(segments)
        masks = [
            None
            if n == 1 or self.invariant or (short and n <= limit)
            else torch.ones(n, p + n, dtype=torch.bool, device=ids.device).tril(diagonal=p)
            for _, p, _, n in segments
        ]
        batched = None
        if short:  # the kernel takes the short segments in one call: no masks, no batched view
            pass
        elif self.invariant:  # each row's bits as alone (see _batched_row_attention)
            batched = _Batched.of(segments, ids.device, hq // hk)
        elif self.embed.dtype == torch.float32:
            batched = _Batched.of(segments, ids.device)
        if batched is not None:
            batched.prepare(pool, segments)
        # Through the module (one call a step): forward hooks on the embeddings still see every pass's [1, T] ids.
        h = self.model.model.embed_tokens(ids.unsqueeze(0))[0]
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
