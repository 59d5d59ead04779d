"""The multiplies of the fast CPU step (trtspec.runtimes.inflight.llama_step): a linear layer on a CPU-friendly copy
of its weight (trtspec's own kernels, oneDNN's blocked layout, MKL's packed copies, or the plain one), fused
projections, and whether the bfloat16 path gives every row of a pass the bits it would get alone."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from trtspec.runtimes.inflight import cpu_kernels

# oneDNN's bfloat16 matrix multiply on a CPU gives each row the same bits whatever the number of rows when the
# reduction (input) dimension is at most this; longer reductions are split by rows into differently ordered sums
# (measured with torch 2.13 on AVX512-BF16: row results changed from 2-6 rows on at 1088-2048 inputs, never at
# <= 1024 up to 300 rows; tests/test_llama_step.py checks it on the machine that runs the tests).
INVARIANT_REDUCTION = 1024
_ONEDNN_ROWS = 4  # at most the row count float32 weights are packed for (see Linear)


class Linear:
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


def fuse(modules: Sequence[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
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


def row_invariant(weight: torch.Tensor) -> bool:
    """Whether the step computes with ``weight`` so that every row of a pass gets the bits it would get alone: the
    bfloat16 path on a CPU (multiplies split at INVARIANT_REDUCTION inputs, attention by row_attention.row_attention).
    Then a verification of K + 1 tokens, batched with other sequences or not, computes exactly what K + 1 decode steps
    would, and greedy speculative output is the target-only output bit for bit. (The float32 path is not: MKL's sgemm
    and scaled_dot_product_attention round differently by row count, rarely enough to flip a greedy token.)"""
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
