"""trtspec's own CPU kernels for the fused decode step (x86-64 with AVX2 and FMA), float32 and bfloat16: the multiply,
the layer's elementwise work and the attention over the slot cache.

**The multiply**, y = x W^T + b. A decode step or a verification multiplies a handful of rows by every weight of the
model once: memory-bound work. oneDNN's and MKL's kernels for it read the weights well below the machine's streaming
bandwidth and cost 1.2-1.3x more for 5 rows than for one. ``cpu_kernels_multiply.c`` (next to this file) loads each
weight vector once per group of up to four rows and keeps every row's accumulator in registers. Measured on a 2-core AMD
EPYC (AVX2), the 120 multiplies of SmolLM2-135M's 30 layers (425 MB of float32 weights), two threads: 28.1 / 30.0 / 33.9
/ 29.8 / 34.5 ms for 1 / 2 / 3 / 5 / 8 rows against 41.8 / 41.9 / 41.8 / 48.2 / 49.7 ms through oneDNN's packed weights
(the path before); from 16 rows on oneDNN is faster, so this kernel takes passes of at most :data:`MAX_ROWS` rows. Every
output is summed in the same order whatever the number of rows, so a row's bits do not depend on the pass it is in
(``tests/test_cpu_kernels.py`` checks it): a verification's rows equal the decode steps' rows for these multiplies.

**The bfloat16 multiply** reads half the bytes: each output a float32 sum over pairs of products in one order (one
16-lane accumulator in blocks of 32 inputs, VDPBF16PS where the CPU has AVX512-BF16, the same bits from FMAs on AVX2),
rounded once. Its order does not depend on the row count at all, so it takes passes of every size (prefills too:
within 1.1-1.4x of oneDNN's time there) and a bfloat16 model's rows agree between short and long passes. Measured on
a 2-core AMD EPYC with AVX512-BF16 (2026-12-04), the example in process: target-only 46.6 -> 29.9 ms/token against
oneDNN on split reductions (the path before), 37.9-39.1 for the float32 kernels (benchmarks/cpu_runtime.py; with
the weight prefetch of cpu_kernels_multiply.c 47.6 -> 29.0).

**The elementwise work** of a layer (the residual add with the next RMSNorm, the rotary embedding in place, silu(gate)
x up), one call each where eager torch dispatched four to six ops: measured 9.2 ms of a float32 decode step's 30
layers as torch ops on the same machine. Row by row, single-threaded. The bfloat16 variants round where torch's
bfloat16 ops do (each op computes in float32 and rounds its result), so they give torch's bits but for the order of
the norm's mean. **The attention** kernel: every (row, query head) over its slot's keys in order, float32 sums, a
max-subtracted softmax; in bfloat16 it takes every segment, prefills included (faster than two batched multiplies at
16-1000 tokens, measured), in float32 the segments of at most :data:`ATTEND_ROWS` tokens.

**The whole pass** (``cpu_kernels_pass.c``, :func:`whole_pass`): every layer's kernels in one call from C, in the
order the step calls them one by one (9 a layer), with the same arguments, so the same bits; a
one-token pass of SmolLM2-135M spent 2.4 of its 13.4 ms in Python between its 270 kernel calls. Its threads are one
OpenMP region for the whole pass (:func:`pass_team`), each step dealt between them (a multiply's tiles of outputs,
the attention's work items, the elementwise steps' rows) with a spinning barrier between steps, where each call in
its own region had to wake a sleeping thread 300 times a pass: 1.3x faster one-token passes, 1.3-1.6x faster
verifications (measured in ``cpu_kernels_pass.c``).

The C sources (``cpu_kernels_multiply.c``: the multiplies; ``cpu_kernels_layer.c``: the elementwise work and the
attention; ``cpu_kernels_pass.c``: the whole pass; ``cpu_kernels.h``: what they share) are compiled into one library
once per machine and source, in trtspec's cache directory (``gcc -O3 -march=native -fopenmp``, about a second; keyed
by the sources, the compiler and the CPU's flags, written atomically), then loaded
with ctypes, which releases the GIL for the call. Its OpenMP runtime is torch's own ``libgomp.so.1``, already loaded by
torch, so the threads are torch's (a call passes ``torch.get_num_threads()``, or one thread for a bfloat16 call of
fewer rows than :func:`parallel_rows` under a passive wait, unless its weight is as large as a vocabulary head).
Where it cannot be built or loaded (no AVX2/FMA, not x86-64, no C compiler, ``TRTSPEC_CPU_KERNELS=0``),
:func:`available` is False and the step keeps oneDNN and torch's ops.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trtspec.paths import cache_dir

MAX_ROWS = 8  # float32 passes of at most this many rows use the kernel (oneDNN was faster from 16 rows on, measured)
BF16_BLOCK = 32  # the bfloat16 multiply reads its inputs in blocks of this many
SOURCES = tuple(
    Path(__file__).with_name(n) for n in ("cpu_kernels_multiply.c", "cpu_kernels_layer.c", "cpu_kernels_pass.c")
)
HEADER = Path(__file__).with_name("cpu_kernels.h")
_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_LIBS = ("-lm",)

log = logging.getLogger(__name__)
_state: dict[str, Any] = {}
_lock = threading.Lock()  # one build and load, whichever thread asks first


def enabled() -> bool:
    """Whether the environment allows the kernel (``TRTSPEC_CPU_KERNELS=0`` turns it off, e.g. to compare paths)."""
    return os.environ.get("TRTSPEC_CPU_KERNELS", "1") != "0"


def available() -> bool:
    """Whether the kernel is enabled and runs on this machine (compiled and loaded on first call)."""
    return enabled() and _function() is not None


def applies(weight: torch.Tensor) -> bool:
    """Whether :func:`linear` can multiply by ``weight``: contiguous float32, or bfloat16 with a multiple of
    :data:`BF16_BLOCK` inputs, on the CPU, kernels available."""
    return (
        weight.dtype in (torch.float32, torch.bfloat16)
        and weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.is_contiguous()
        and (weight.dtype == torch.float32 or weight.shape[1] % BF16_BLOCK == 0)
        and available()
    )


def every_row(weight: torch.Tensor) -> bool:
    """Whether :func:`linear` serves passes of every size with ``weight`` (bfloat16: its multiply is as fast as
    oneDNN's where a pass is short and within 1.1-1.4x where it is long, and a row's bits are the same at every row
    count, so short and long passes of one model agree), not only passes of at most :data:`MAX_ROWS` rows."""
    return weight.dtype == torch.bfloat16 and applies(weight)


def bf16_native() -> bool:
    """Whether the bfloat16 multiply runs on AVX512-BF16 instructions here (else on AVX2, the same bits, slower)."""
    return available() and bool(_kernel("trtspec_bf16_native")())


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T + bias [N] in the weight's dtype (float32 or bfloat16) through the kernel
    (``applies(weight)`` must hold; bfloat16 accumulates in float32 and rounds once)."""
    bf16 = weight.dtype == torch.bfloat16
    fn = _kernel("trtspec_linear_bf16" if bf16 else "trtspec_linear_f32")
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    if k != weight.shape[1] or x.dtype != weight.dtype:
        raise ValueError(f"cpu_kernels.linear: x {tuple(x.shape)} {x.dtype} against weight {tuple(weight.shape)}")
    y = torch.empty(m, n, dtype=weight.dtype)
    b = None if bias is None else bias.to(weight.dtype).contiguous()
    threads = threads_for(m, weight.dtype, weight.numel())
    fn(x.data_ptr(), weight.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr(), m, n, k, threads)
    return y


def add_rmsnorm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``h += delta`` in place (when given), then transformers' RMSNorm of ``h`` [M, H] with ``weight``, float32 or
    bfloat16 (:func:`_typed`), contiguous tensors: the residual add and the next norm in one call."""
    out = torch.empty_like(h)
    d = None if delta is None else delta.contiguous()
    _typed("trtspec_add_rmsnorm", h)(
        h.data_ptr(),
        None if d is None else d.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        h.shape[0],
        h.shape[1],
        eps,
    )
    return out


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, head_dim: int) -> None:
    """Rotary embedding in place on the first ``heads`` heads of every row of ``x`` [M, >= heads * head_dim]
    (contiguous rows), rotate-half form, ``cos``/``sin`` [M, head_dim] contiguous, all one dtype."""
    assert x.stride(1) == 1 and cos.is_contiguous() and sin.is_contiguous()
    _typed("trtspec_rope", x)(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.shape[0], x.stride(0), heads, head_dim)


def silu_mul(gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
    """silu(gate) * up for ``gate_up`` = [gate | up] [M, 2 * intermediate], float32 or bfloat16, contiguous."""
    out = gate_up.new_empty(gate_up.shape[0], intermediate)
    _typed("trtspec_silu_mul", gate_up)(gate_up.data_ptr(), out.data_ptr(), gate_up.shape[0], intermediate)
    return out


ATTEND_ROWS = 16  # segments of at most this many tokens (decoding, verification) attend through the kernel
ATTEND_DIM = 256  # head_dim at most (cpu_kernels_layer.c's ATT_DIM: its scratch rows)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    segments: torch.Tensor,
    scaling: float,
) -> torch.Tensor:
    """Write every segment's ``k``/``v`` rows into its slot of ``keys``/``values`` [slots, hk, capacity, d] and attend
    its ``q`` rows causally over the slot: [T, hq, d] (rows outside the segments are left unwritten). ``segments`` [S,
    4] int64: (slot, past, start, count); float32 or bfloat16 contiguous tensors, d a multiple of 8 and at most
    :data:`ATTEND_DIM`. Each row's result depends only on its position and cache (bfloat16: float32 sums, each output
    rounded once); the query heads that share a KV head go over its keys and values together."""
    t, hq, d = q.shape
    slots, hk, capacity, _ = keys.shape
    assert (
        d % 8 == 0
        and d <= ATTEND_DIM
        and keys.is_contiguous()
        and values.is_contiguous()
        and segments.dtype == torch.int64
    )
    q, k, v, segments = q.contiguous(), k.contiguous(), v.contiguous(), segments.contiguous()
    out = torch.empty_like(q)
    _typed("trtspec_attend", q)(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        keys.data_ptr(),
        values.data_ptr(),
        out.data_ptr(),
        segments.data_ptr(),
        segments.shape[0],
        hq,
        hk,
        capacity,
        d,
        scaling,
        threads_for(t, q.dtype),
    )
    return out


# The addresses of one layer in whole_pass's table, in cpu_kernels_pass.c's order (a bias absent: 0).
PASS_SLOTS = (
    "norm1",
    "qkv",
    "qkv_bias",
    "o",
    "o_bias",
    "norm2",
    "gate_up",
    "gate_up_bias",
    "down",
    "down_bias",
    "keys",
    "values",
)


def whole_pass(
    h: torch.Tensor,
    layers: torch.Tensor,
    final_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    segments: torch.Tensor,
    geometry: tuple[int, int, int, int, int],
    eps: float,
    scaling: float,
    threads: Sequence[int],
    team: int = 1,
) -> torch.Tensor:
    """A pass through every layer in one call (``cpu_kernels_pass.c``), float32 or bfloat16: per layer the residual
    add with the norm, the q/k/v multiply, the rotary embedding, the attention over the slot caches, o, the norm,
    gate/up, silu x up and down, then the final norm; the same kernels and arguments as the calls one by one, so the
    same bits. ``h`` [T, H] (updated in place), ``layers`` [L, len(PASS_SLOTS)] int64 addresses, ``cos``/``sin`` [T,
    head_dim], ``segments`` as :func:`attend`'s (every slot within the caches, every segment within a slot's
    capacity: the caller checks, ``SlotKVPool.check_segments``), ``geometry`` (heads, kv_heads, head_dim,
    intermediate, cache capacity).

    ``team`` 1: each kernel with its own thread count, ``threads`` for the q/k/v, o, gate/up and down multiplies and
    the attention (as :func:`threads_for` gives them). ``team`` > 1: one OpenMP region of that many threads for the
    whole pass (:func:`pass_team`), each step dealt between them. Returns the final norm's output [T, H]."""
    assert h.is_contiguous() and layers.dtype == torch.int64 and layers.is_contiguous()
    assert cos.is_contiguous() and sin.is_contiguous() and segments.dtype == torch.int64 and segments.is_contiguous()
    hq, hk, d, inter, cap = geometry
    out = torch.empty_like(h)
    counts = (ctypes.c_int * 5)(*threads)
    status = _typed("trtspec_pass", h)(
        h.data_ptr(),
        out.data_ptr(),
        layers.data_ptr(),
        layers.shape[0],
        final_norm.data_ptr(),
        cos.data_ptr(),
        sin.data_ptr(),
        segments.data_ptr(),
        segments.shape[0],
        h.shape[0],
        h.shape[1],
        hq,
        hk,
        d,
        inter,
        cap,
        eps,
        scaling,
        counts,
        max(1, team),
    )
    if status != 0:
        raise MemoryError(f"cpu_kernels.whole_pass: no scratch for a pass of {h.shape[0]} tokens")
    return out


def argmax(x: torch.Tensor) -> list[int]:
    """Each row's index of its largest value, as ``x.argmax(-1)`` gives it (the first of equal maxima; a NaN larger
    than any number), for float32 or bfloat16 logits [M, N] on the CPU, read in place: a greedy step's tokens without
    torch's float32 copy and argmax (0.4 ms a step over SmolLM2's 49,152 logits). Any other tensor, or no kernels:
    torch's own."""
    if x.dim() != 2 or x.dtype not in _SUFFIX or x.device.type != "cpu" or not available():
        return x.float().argmax(-1).tolist()
    x = x.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.int64)
    _typed("trtspec_argmax", x)(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr())
    return out.tolist()


def _typed(name: str, like: torch.Tensor) -> Any:
    """The float32 or bfloat16 variant of kernel ``name`` for tensors like ``like``."""
    if like.dtype not in _SUFFIX:
        raise ValueError(f"{name}: trtspec's CPU kernels take float32 or bfloat16, not {like.dtype}")
    return _kernel(name + _SUFFIX[like.dtype])


_SUFFIX = {torch.float32: "_f32", torch.bfloat16: "_bf16"}


def _kernel(name: str) -> Any:
    if _function() is None:
        raise RuntimeError(f"{name}: trtspec's CPU kernels are not available here")
    return _state[name]


def _threads() -> int:
    return max(1, torch.get_num_threads())


def pass_team() -> int:
    """The threads of a whole pass's one OpenMP region (:func:`whole_pass` ``team``): torch's, whatever the rows.

    Each kernel call in its own region, a thread asleep under a passive wait (trtspec.threads) is woken by a futex
    at every call, 300 times a pass, so a call of fewer than :data:`PASSIVE_PARALLEL_ROWS` rows runs on one thread.
    One region a pass wakes it once; between the steps of the pass the threads spin on a barrier (then yield)."""
    return _threads()


# Where OpenMP's threads wait passively (trtspec.threads), each parallel call wakes a sleeping thread, and on a VM
# that goes through the hypervisor: tens of microseconds per call, more than a few rows' multiply gains from a second
# core. Measured on a 2-core AMD EPYC (AVX512-BF16), the example's bfloat16 target, passes alternated in one process
# (medians of 10): 1 sequence x 1 token 23.3 ms on two threads, 19.2 on one; 1 x 5 tokens 25.2 / 22.6; but 8 x 1
# 28.1 / 30.8, 8 x 2 39.2 / 43.6, 8 x 5 74.7 / 107.8. So under a passive wait a bfloat16 call of fewer rows than
# this runs on one thread (the calling one: nothing to wake); a thread that spins (GOMP_SPINCOUNT, or another wait
# policy) wakes at once and every call takes all threads. TRTSPEC_PARALLEL_ROWS sets it. float32 calls keep every
# thread: their weights are twice the bytes, and one thread verified 5 tokens 1.08x slower (decoding one 0.90x).
PASSIVE_PARALLEL_ROWS = 8
# ... except a multiply whose weights are this many elements or more: the vocabulary head (49,152 x 576 on SmolLM2,
# 56 MB in bfloat16) streams its weights from memory for milliseconds, and one wake-up is a few hundredths of that.
# Measured on the 2-core AMD EPYC (AVX512-BF16), passive wait, each call after a pass's worth of one-thread calls
# (the second thread asleep, the weights out of cache), medians of 40: the head at 1 row 2.38 ms on one thread, 1.87
# on two; at 5 rows 2.65 / 1.84; the draft's 8,192-row head 0.44 / 0.38. The layers' weights (at most 1.8M elements)
# stay under it. Each output is still one thread's sum in a fixed order: the bits do not change.
PARALLEL_ELEMENTS = 1 << 22


def parallel_rows(dtype: torch.dtype = torch.bfloat16) -> int:
    """The fewest rows a kernel call on ``dtype`` splits over torch's threads (1: every call; bfloat16 under a
    passive wait: PASSIVE_PARALLEL_ROWS)."""
    if dtype != torch.bfloat16:
        return 1
    if "rows" not in _state:
        from trtspec.threads import waits_passively

        env = os.environ.get("TRTSPEC_PARALLEL_ROWS", "")
        _state["rows"] = int(env) if env.isdigit() else PASSIVE_PARALLEL_ROWS if waits_passively() else 1
    return int(_state["rows"])


def threads_for(rows: int, dtype: torch.dtype = torch.bfloat16, elements: int = 0) -> int:
    """Threads for a kernel call of ``rows`` rows on ``dtype`` over a weight of ``elements`` elements (0: not a
    multiply): all of torch's from :func:`parallel_rows` rows on, or for a weight of PARALLEL_ELEMENTS or more."""
    return _threads() if rows >= parallel_rows(dtype) or elements >= PARALLEL_ELEMENTS else 1


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _function() -> Any | None:
    if "fn" in _state:
        return _state["fn"]
    with _lock:
        if "fn" not in _state:
            _state["fn"] = _load()
    return _state["fn"]


def _load() -> Any | None:
    flags = set(_cpu_flags().split())
    compiler = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= flags or compiler is None:
        return None
    try:
        lib = ctypes.CDLL(str(_built(compiler, " ".join(sorted(flags)))))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("trtspec's CPU kernel could not be built (%s); the decode step keeps oneDNN's", e)
        return None
    ptr, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    for name, argtypes in (
        ("trtspec_linear_f32", [ptr] * 4 + [i32] * 4),
        ("trtspec_linear_bf16", [ptr] * 4 + [i32] * 4),
        ("trtspec_add_rmsnorm_f32", [ptr] * 4 + [i32] * 2 + [f32]),
        ("trtspec_rope_f32", [ptr] * 3 + [i32] * 4),
        ("trtspec_silu_mul_f32", [ptr] * 2 + [i32] * 2),
        ("trtspec_attend_f32", [ptr] * 7 + [i32] * 5 + [f32, i32]),
        ("trtspec_add_rmsnorm_bf16", [ptr] * 4 + [i32] * 2 + [f32]),
        ("trtspec_rope_bf16", [ptr] * 3 + [i32] * 4),
        ("trtspec_silu_mul_bf16", [ptr] * 2 + [i32] * 2),
        ("trtspec_attend_bf16", [ptr] * 7 + [i32] * 5 + [f32, i32]),
    ):
        f = getattr(lib, name)
        f.argtypes, f.restype = argtypes, None
        _state[name] = f
    pass_args: list[Any] = [ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, *[i32] * 8, f32, f32, ctypes.POINTER(i32), i32]
    for name in ("trtspec_pass_f32", "trtspec_pass_bf16"):
        whole = getattr(lib, name)
        whole.argtypes, whole.restype = pass_args, i32
        _state[name] = whole
    for name in ("trtspec_argmax_f32", "trtspec_argmax_bf16"):
        f = getattr(lib, name)
        f.argtypes, f.restype = [ptr, i32, i32, ptr], None
        _state[name] = f
    native = lib.trtspec_bf16_native
    native.argtypes, native.restype = [], i32
    _state["trtspec_bf16_native"] = native
    return lib.trtspec_linear_f32


def _built(compiler: str, cpu_flags: str) -> Path:
    """The shared library for this source, compiler and CPU, compiled into the cache on first use (atomically)."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(
        "\0".join(
            [*(f.read_text() for f in (HEADER, *SOURCES)), compiler, version, cpu_flags, " ".join(_FLAGS + _LIBS)]
        ).encode()
    ).hexdigest()[:16]
    out = cache_dir() / "kernels" / f"cpu_kernels-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run(
            [compiler, *_FLAGS, *map(str, SOURCES), "-o", tmp, *_LIBS], capture_output=True, text=True, check=True
        )
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
