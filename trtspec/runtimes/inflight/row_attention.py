"""Row-invariant attention of the fast CPU step's bfloat16 path (trtspec.runtimes.inflight.llama_step): each query
row computed as it would be alone, one sequence at a time or the short segments of several sequences in one call per
layer (``BatchedSegments``), so that a verification of K + 1 tokens, batched or not, equals K + 1 decode steps bit
for bit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trtspec.runtimes.inflight.kv_pool import SlotKVPool
from trtspec.runtimes.inflight.linear import INVARIANT_REDUCTION


def row_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, scaling: float) -> torch.Tensor:
    """Causal attention of ``q`` [n, hq, d] (positions past .. past + n - 1) over ``keys``/``values`` [hk, past + n,
    d], each query row computed as it would be alone: two batched multiplies per kv head with a reduction of d and of
    the keys (zero weights past a row's last key add exact zeros; the keys split as in :func:`_weighted_values`), a
    float32 softmax per row. On a CPU in bfloat16 this is also 2-6x faster than scaled_dot_product_attention for one
    query (measured: 67-176 us against 156-1045 us at 10-1500 cached tokens, 9 heads of 64)."""
    n, hq, d = q.shape
    hk, length = keys.shape[0], keys.shape[1]
    g = hq // hk
    qq = q.view(n, hk, g, d).permute(1, 0, 2, 3).reshape(hk, n * g, d)
    scores = torch.bmm(qq, keys.contiguous().transpose(1, 2)).float()  # see batched_row_attention
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


def batched_row_attention(
    qp: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor, scaling: float
) -> torch.Tensor:
    """:func:`row_attention` of several slots at once: ``qp`` [R, W, hq, d] (queries padded to the widest segment),
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


class BatchedSegments:
    """The short segments of a pass (decoding and verification rows of several sequences), attended with one call per
    layer instead of one per sequence (float32: scaled_dot_product_attention; bfloat16 with linear.row_invariant:
    :func:`batched_row_attention`, each row's bits as alone): their slots as one view of the cache
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
    def of(cls, segments: Sequence[tuple[int, int, int, int]], device: Any, groups: int = 0) -> BatchedSegments | None:
        members = {j: seg for j, seg in enumerate(segments) if seg[3] <= BATCHED_QUERIES}
        if len(members) < 2:
            return None
        slots = [s for s, _, _, _ in members.values()]
        if max(slots) - min(slots) + 1 > 2 * len(slots):
            return None
        return cls(members, device, groups)
