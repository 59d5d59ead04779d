"""trtspec's CPU kernels (trtspec.runtimes.inflight.cpu_kernels), compiled and run on this machine: the few-row float32
multiply's and the bfloat16 multiply's results, each row's bits independent of the rows beside it and of the thread
count, the bfloat16 multiply's AVX512-BF16 and AVX2 builds agreeing bit for bit, the elementwise kernels against
torch's ops, the fused step using them, and the switch that turns them off."""

from __future__ import annotations

import pytest
import torch

from trtspec.runtimes.inflight import cpu_kernels

needs_kernel = pytest.mark.skipif(not cpu_kernels.available(), reason="no AVX2/FMA x86-64 CPU or no C compiler here")


@needs_kernel
@pytest.mark.parametrize("n, k", [(960, 576), (576, 1536), (37, 13), (5, 8), (3, 21)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_multiplies_like_float64_within_float32_rounding(n: int, k: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if with_bias else None
    for m in range(1, cpu_kernels.MAX_ROWS + 1):
        x = torch.randn(m, k, generator=g)
        ref = x.double() @ w.double().T + (0 if b is None else b.double())
        y = cpu_kernels.linear(x, w, b)
        assert y.shape == (m, n) and y.dtype == torch.float32
        tol = 1e-5 * (x.double().abs() @ w.double().abs().T).max().item() + 1e-6
        assert (y.double() - ref).abs().max().item() <= tol


def _rows_alone_and_in_every_pass(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` multiplied alone; asserts that every pass of the first m rows (m = 1 .. all) gives those
    bits, on 1, 2 and the default thread count."""
    alone = torch.cat([cpu_kernels.linear(x[i : i + 1], w, b) for i in range(len(x))])
    threads = torch.get_num_threads()
    try:
        for t in sorted({1, 2, threads}):
            torch.set_num_threads(t)
            for m in range(1, len(x) + 1):
                assert torch.equal(cpu_kernels.linear(x[:m], w, b), alone[:m]), (m, t)
    finally:
        torch.set_num_threads(threads)
    return alone


@needs_kernel
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it_or_the_threads() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3072, 576, generator=g)
    b = torch.randn(3072, generator=g)
    x = torch.randn(cpu_kernels.MAX_ROWS, 576, generator=g)
    alone = _rows_alone_and_in_every_pass(x, w, b)
    # an ordinary float32 multiply rounds differently: equality above is the kernel's order, not luck
    assert not torch.equal(torch.nn.functional.linear(x, w, b), alone)


@needs_kernel
@pytest.mark.parametrize("n, k", [(8, 37), (6, 580), (12, 1001)])
def test_a_float32_rows_bits_do_not_depend_on_the_pass_where_the_inputs_end_in_a_scalar_tail(n: int, k: int) -> None:
    """K not a multiple of 8 ends each sum in a scalar loop: one out-of-line copy serves every tile (inlined, the
    2 x 3 tile's copy once added its products in another way, and rows of a 3- or 7-row pass got other bits)."""
    g = torch.Generator().manual_seed(k)
    w, b, x = torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.randn(9, k, generator=g)
    _rows_alone_and_in_every_pass(x, w, b)


def _bf16_case(n: int, k: int, m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).bfloat16() for shape in ((m, k), (n, k), (n,)))  # type: ignore[return-value]


@needs_kernel
@pytest.mark.parametrize("n, k", [(960, 576), (577, 1536), (3, 32)])
def test_the_bfloat16_multiply_is_a_float32_sum_rounded_once(n: int, k: int) -> None:
    x, w, b = _bf16_case(n, k, 100, n + k)
    for m in (1, 2, 5, 8, 13, 100):
        for bias in (None, b):
            y = cpu_kernels.linear(x[:m], w, bias)
            assert y.shape == (m, n) and y.dtype == torch.bfloat16
            ref = x[:m].double() @ w.double().T + (0 if bias is None else bias.double())
            # one bfloat16 rounding of the result (half an ulp: 2^-9 relative) plus float32 summation error
            tol = ref.abs() * 2.0**-8 + 1e-5 * (x[:m].double().abs() @ w.double().abs().T)
            assert ((y.double() - ref).abs() <= tol).all(), m
            assert (y == ref.bfloat16()).double().mean().item() > 0.97


@needs_kernel
def test_a_bfloat16_rows_bits_do_not_depend_on_the_pass_at_any_row_count_or_thread_count() -> None:
    x, w, b = _bf16_case(3072, 576, 100, 0)
    alone = torch.cat([cpu_kernels.linear(x[i : i + 1], w, b) for i in range(len(x))])
    threads = torch.get_num_threads()
    try:
        for t in sorted({1, 2, threads}):
            torch.set_num_threads(t)
            for m in (*range(1, 14), 40, 100):
                assert torch.equal(cpu_kernels.linear(x[:m], w, b), alone[:m]), (m, t)
            assert torch.equal(cpu_kernels.linear(x[37:45], w, b), alone[37:45])
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.skipif(not cpu_kernels.bf16_native(), reason="no AVX512-BF16 here: only the AVX2 build runs")
def test_the_bfloat16_multiply_s_avx512_bf16_and_avx2_builds_give_the_same_bits(tmp_path) -> None:
    """A model's bits must not depend on which build a machine runs: the AVX2 build adds each pair's products in the
    order VDPBF16PS does."""
    import ctypes
    import subprocess

    lib = tmp_path / "avx2.so"
    subprocess.run(
        [
            "gcc",
            "-O3",
            "-march=haswell",
            "-fopenmp",
            "-shared",
            "-fPIC",
            *map(str, cpu_kernels.SOURCES),
            "-o",
            lib,
            "-lm",
        ],
        check=True,
    )
    avx2 = ctypes.CDLL(str(lib))
    avx2.trtspec_linear_bf16.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    assert avx2.trtspec_bf16_native() == 0
    for n, k, m in ((960, 576, 5), (49, 1536, 13), (3072, 576, 1)):
        x, w, b = _bf16_case(n, k, m, n)
        y = torch.empty(m, n, dtype=torch.bfloat16)
        avx2.trtspec_linear_bf16(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), m, n, k, 2)
        assert torch.equal(y, cpu_kernels.linear(x, w, b))


@needs_kernel
def test_the_fused_bfloat16_step_multiplies_every_pass_through_it(tiny_pair) -> None:
    from transformers import AutoModelForCausalLM

    from trtspec.runtimes.inflight.llama_step import LlamaStep

    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.bfloat16).eval()
    step = LlamaStep(model)
    for lin in (step.layers[0].qkv, step.layers[0].gate_up, step.layers[0].down, step.head):
        assert lin is not None and lin.every_row and not lin.pieces and lin.onednn is None  # no second copy
        for m in (1, 5, 40):
            x = torch.randn(m, lin.weight.shape[1]).bfloat16()
            assert torch.equal(lin(x), cpu_kernels.linear(x, lin.weight, lin.bias))


@needs_kernel
def test_the_fused_float32_step_multiplies_few_rows_through_it(tiny_pair) -> None:
    from transformers import AutoModelForCausalLM

    from trtspec.runtimes.inflight.llama_step import LlamaStep

    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32).eval()
    step = LlamaStep(model)
    lin = step.layers[0].gate_up
    assert lin.small
    x = torch.randn(3, lin.weight.shape[1])
    assert torch.equal(lin(x), cpu_kernels.linear(x, lin.weight, lin.bias))
    big = torch.randn(cpu_kernels.MAX_ROWS + 1, lin.weight.shape[1])  # longer passes: oneDNN's packed copy
    assert torch.allclose(lin(big), torch.nn.functional.linear(big, lin.weight, lin.bias), atol=1e-4)


@needs_kernel
def test_the_elementwise_kernels_compute_what_torch_s_ops_do() -> None:
    from trtspec.runtimes.inflight.llama_step import LlamaStep

    g = torch.Generator().manual_seed(1)
    m, hidden, heads, d, inter = 5, 576, 12, 64, 1536
    h, delta = (torch.randn(m, hidden, generator=g) for _ in range(2))
    w = torch.randn(hidden, generator=g)
    ref_h = h + delta
    hh = ref_h * torch.rsqrt(ref_h.pow(2).mean(-1, keepdim=True) + 1e-5)
    out = cpu_kernels.add_rmsnorm(h, delta, w, 1e-5)
    assert torch.equal(h, ref_h)  # the residual added in place
    assert torch.allclose(out, w * hh, rtol=1e-5, atol=1e-6)
    assert torch.allclose(cpu_kernels.add_rmsnorm(h, None, w, 1e-5), out, rtol=1e-6, atol=1e-7)

    x = torch.randn(m, heads * d + 100, generator=g)  # rows wider than the rotated heads (a qkv row)
    cos, sin = torch.randn(m, d, generator=g), torch.randn(m, d, generator=g)
    ref = LlamaStep._rope(x[:, : heads * d].view(m, heads, d), cos.unsqueeze(1), sin.unsqueeze(1))
    tail = x[:, heads * d :].clone()
    cpu_kernels.rope_(x, cos, sin, heads, d)
    assert torch.allclose(x[:, : heads * d].view(m, heads, d), ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(x[:, heads * d :], tail)

    gu = torch.randn(m, 2 * inter, generator=g) * 4
    ref = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    assert torch.allclose(cpu_kernels.silu_mul(gu, inter), ref, rtol=1e-5, atol=1e-6)


@needs_kernel
def test_the_bfloat16_elementwise_kernels_give_torch_s_bits() -> None:
    """torch's bfloat16 ops compute in float32 and round each result; the kernels round where they do: the rotary
    embedding, silu x up and the residual add bit for bit, the norm (another order of its mean) within one ulp."""
    from trtspec.runtimes.inflight.llama_step import LlamaStep

    g = torch.Generator().manual_seed(3)
    m, hidden, heads, d, inter = 5, 576, 12, 64, 1536
    h, delta = (torch.randn(m, hidden, generator=g).bfloat16() for _ in range(2))
    w = torch.randn(hidden, generator=g).bfloat16()
    ref_h = h + delta
    hf = ref_h.float()
    ref_norm = w * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    out = cpu_kernels.add_rmsnorm(h, delta, w, 1e-5)
    assert torch.equal(h, ref_h) and out.dtype == torch.bfloat16
    assert ((out.float() - ref_norm.float()).abs() <= ref_norm.float().abs() * 2.0**-7 + 1e-30).all()
    assert (out == ref_norm).float().mean().item() > 0.95

    x = torch.randn(m, heads * d + 100, generator=g).bfloat16()
    cos, sin = (torch.randn(m, d, generator=g).bfloat16() for _ in range(2))
    ref = LlamaStep._rope(x[:, : heads * d].view(m, heads, d), cos.unsqueeze(1), sin.unsqueeze(1))
    tail = x[:, heads * d :].clone()
    cpu_kernels.rope_(x, cos, sin, heads, d)
    assert torch.equal(x[:, : heads * d].view(m, heads, d), ref)
    assert torch.equal(x[:, heads * d :], tail)

    gu = (torch.randn(m, 2 * inter, generator=g) * 4).bfloat16()
    ref = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    got = cpu_kernels.silu_mul(gu, inter)
    assert got.dtype == torch.bfloat16 and (got == ref).float().mean().item() > 0.999  # expf's last bit aside
    assert torch.allclose(got.float(), ref.float(), rtol=2.0**-7, atol=0)


@needs_kernel
@pytest.mark.parametrize("inter", [1536, 13])
def test_silu_takes_the_correctly_rounded_exponential_eight_at_a_time_and_in_the_tail(inter: int) -> None:
    """The vector silu's e^-x is computed in double and rounded once (cpu_kernels.h, exp8_f32): each element gets
    the float32 expression x / (1 + expf(-x)) * u with expf correctly rounded, in the body of a row and in its
    padded last I % 8 alike; over the whole float range (overflow to inf, underflow to 0, NaN) too."""
    import numpy as np

    g = torch.Generator().manual_seed(inter)
    gu = torch.randn(64, 2 * inter, generator=g) * torch.tensor([0.1, 1.0, 4.0, 30.0]).repeat(16).unsqueeze(1)
    special = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.7, -88.7, 89.0, -89.0, 104.0, -104.0, 1e4, -1e4])
    gu[0, : len(special)] = special
    gu[1, : inter - 1 : 2] = float("inf")
    gu[1, 1 : inter - 1 : 2] = float("-inf")
    gu[2, 0] = float("nan")
    x, u = gu[:, :inter].numpy(), gu[:, inter:].numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(-x.astype(np.float64)).astype(np.float32)  # numpy's double exp: accurate far below float32's ulp
        ref = torch.from_numpy(x / (np.float32(1.0) + e) * u)
    got = cpu_kernels.silu_mul(gu.contiguous(), inter)
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32)) or torch.equal(
        torch.nan_to_num(got), torch.nan_to_num(ref)
    )
    bf = gu.bfloat16()
    xb = bf[:, :inter].float().numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        s = torch.from_numpy(xb / (np.float32(1.0) + np.exp(-xb.astype(np.float64)).astype(np.float32)))
    ref_b = (s.bfloat16().float() * bf[:, inter:].float()).bfloat16()  # silu rounded, then the product rounded
    got_b = cpu_kernels.silu_mul(bf.contiguous(), inter)
    assert torch.equal(torch.nan_to_num(got_b.float()), torch.nan_to_num(ref_b.float()))


@needs_kernel
def test_a_bfloat16_norm_row_gets_the_same_bits_in_any_group_of_rows() -> None:
    """add_rmsnorm takes rows in fours (their sums side by side) and the rest one by one: a row's residual and norm
    bits are the same whichever way it went."""
    g = torch.Generator().manual_seed(5)
    for hidden in (576, 13):
        h = (torch.randn(9, hidden, generator=g) * 3).bfloat16()
        delta = torch.randn(9, hidden, generator=g).bfloat16()
        w = torch.randn(hidden, generator=g).bfloat16()
        alone = [cpu_kernels.add_rmsnorm(h[i : i + 1].clone(), delta[i : i + 1], w, 1e-5) for i in range(9)]
        for m in (4, 5, 8, 9):
            hm = h[:m].clone()
            out = cpu_kernels.add_rmsnorm(hm, delta[:m].contiguous(), w, 1e-5)
            assert torch.equal(hm, (h[:m].float() + delta[:m].float()).bfloat16())
            assert torch.equal(out.view(torch.int16), torch.cat(alone[:m]).view(torch.int16)), (hidden, m)


@needs_kernel
def test_bfloat16_attention_matches_float64_and_each_row_is_its_own_at_any_length() -> None:
    """float32 sums over bfloat16 keys and values, each output rounded once: within a bfloat16 rounding of the float64
    result, and a row's bits the same in a pass of 1, 5 or 40 rows (a prefill takes the same kernel in bfloat16)."""
    g = torch.Generator().manual_seed(4)
    hq, hk, cap, d = 9, 3, 128, 64
    cached = [torch.randn(1, hk, 60, d, generator=g).bfloat16() for _ in range(2)]
    q, k, v = (torch.randn(40, h, d, generator=g).bfloat16() for h in (hq, hk, hk))
    scale = d**-0.5

    def run(past: int, a: int, n: int) -> torch.Tensor:
        keys, values = (torch.zeros(1, hk, cap, d, dtype=torch.bfloat16) for _ in range(2))
        keys[:, :, :60], values[:, :, :60] = cached
        keys[0, :, 60 : 60 + a], values[0, :, 60 : 60 + a] = k[:a].transpose(0, 1), v[:a].transpose(0, 1)
        seg = torch.tensor([[0, past, 0, n]])
        return cpu_kernels.attend(q[a : a + n], k[a : a + n], v[a : a + n], keys, values, seg, scale)

    full = run(60, 0, 40)
    keys = torch.cat([cached[0][0], k.transpose(0, 1)], 1).double()
    values = torch.cat([cached[1][0], v.transpose(0, 1)], 1).double()
    for r in (0, 7, 39):
        qr = q[r].double().view(hk, hq // hk, d)
        p = torch.softmax((qr @ keys[:, : 61 + r].transpose(1, 2)) * scale, -1)
        ref = (p @ values[:, : 61 + r]).reshape(hq, d)
        assert (full[r].double() - ref).abs().max().item() <= 2.0**-7 * ref.abs().max().item()
    for a, n in ((0, 1), (3, 5), (35, 5), (39, 1)):
        assert torch.equal(run(60 + a, a, n), full[a : a + n])


@needs_kernel
@pytest.mark.parametrize(
    ("hq", "hk", "d"),
    [(9, 3, 64), (4, 4, 64), (8, 2, 128), (12, 1, 32), (6, 2, 256)],
    ids=["gqa3-d64", "mha-d64", "gqa4-d128", "gqa12-d32", "gqa3-d256"],
)
def test_attention_over_the_slot_cache_matches_sdpa_and_each_row_is_its_own(hq: int, hk: int, d: int) -> None:
    """Every query head of a row over its KV head's keys (the kernel takes a KV head's query heads together, in
    turns of at most 8, with code specialised for some group and head sizes): as sdpa, and each row's bits the same
    in the pass as alone."""
    g = torch.Generator().manual_seed(2)
    slots, cap = 4, 64
    keys, values = torch.zeros(slots, hk, cap, d), torch.zeros(slots, hk, cap, d)
    for t in (keys, values):  # cached history of every slot
        t[:, :, :40] = torch.randn(slots, hk, 40, d, generator=g)
    segs = [(2, 30, 0, 5), (0, 12, 5, 1), (3, 39, 6, 3)]  # (slot, past, start, count): a verification, a decode, ...
    t = sum(n for *_, n in segs)
    q, k, v = torch.randn(t, hq, d, generator=g), torch.randn(t, hk, d, generator=g), torch.randn(t, hk, d, generator=g)
    scale = d**-0.5
    kc, vc = keys.clone(), values.clone()
    out = cpu_kernels.attend(q, k, v, kc, vc, torch.tensor(segs).view(-1, 4), scale)
    for slot, past, a, n in segs:
        assert torch.equal(kc[slot, :, past : past + n], k[a : a + n].transpose(0, 1))  # written into the slot
        mask = torch.ones(n, past + n, dtype=torch.bool).tril(diagonal=past)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[a : a + n].transpose(0, 1).unsqueeze(0),
            kc[slot : slot + 1, :, : past + n],
            vc[slot : slot + 1, :, : past + n],
            attn_mask=mask,
            scale=scale,
            enable_gqa=True,
        )[0].transpose(0, 1)
        assert torch.allclose(out[a : a + n], ref, rtol=1e-4, atol=1e-5)
        for r in range(n):  # row by row, as decode steps would: the same bits
            one = cpu_kernels.attend(
                q[a + r : a + r + 1],
                k[a + r : a + r + 1],
                v[a + r : a + r + 1],
                kc.clone(),
                vc.clone(),
                torch.tensor([[slot, past + r, 0, 1]]),
                scale,
            )
            assert torch.equal(one[0], out[a + r])


def test_turned_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTSPEC_CPU_KERNELS", "0")
    assert not cpu_kernels.available()
    assert not cpu_kernels.applies(torch.zeros(4, 8))


@needs_kernel
def test_float32_rows_of_short_passes_get_the_same_bits_whatever_else_is_in_the_pass(tiny_pair) -> None:
    """With the kernels, a float32 pass of at most MAX_ROWS tokens computes each row as it would alone: a
    sequence's 5 tokens after 300 cached ones, fed one per pass (decoding), in one pass (verification) or beside
    another sequence's decode token, give bit-identical hidden states and logits. (With TRTSPEC_CPU_KERNELS=0, oneDNN
    and scaled_dot_product_attention, they do not: checked on this machine.)"""
    from transformers import AutoModelForCausalLM

    from tests.tiny import one_per_pass, pool_with_two_cached
    from trtspec.runtimes.inflight.llama_step import LlamaStep

    target = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32).eval()
    step = LlamaStep(target)
    assert step.elementwise and step.attend_kernel and step.head is not None and step.head.small
    torch.manual_seed(0)
    vocab = target.config.vocab_size
    prompt, tail, other = torch.randint(0, vocab, (300,)), torch.randint(0, vocab, (5,)), torch.randint(0, vocab, (40,))
    results = []
    with torch.inference_mode():
        for how in ("one per pass", "one pass", "beside another sequence"):
            pool = pool_with_two_cached(step, target, prompt, other, 512)
            if how == "one per pass":
                hidden = one_per_pass(step, pool, tail, 300)
            elif how == "one pass":
                hidden = step.body(pool, [(0, 300, 0, 5)], tail, torch.arange(300, 305))
            else:
                ids = torch.cat([tail, torch.randint(0, vocab, (1,))])
                pos = torch.cat([torch.arange(300, 305), torch.tensor([40])])
                hidden = step.body(pool, [(0, 300, 0, 5), (2, 40, 5, 1)], ids, pos)[:5]
            results.append((hidden, step.head(hidden)))
    for hidden, logits in results[1:]:
        assert torch.equal(results[0][0], hidden)
        assert torch.equal(results[0][1], logits)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_per_head_and_grouped_work_items_give_the_same_bits(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """The kernel takes a pass with fewer than two (row, KV head) items per thread one query head per item, else a
    KV head's query heads together: the same sums in the same order, so the same bits, whichever it takes."""
    g = torch.Generator().manual_seed(5)
    slots, hq, hk, cap, d = 2, 9, 3, 64, 64
    cached = [(torch.randn(slots, hk, cap, d, generator=g) * 2).to(dtype) for _ in range(2)]
    for rows in (1, 2, 5):
        q = torch.randn(rows, hq, d, generator=g).to(dtype)
        k, v = (torch.randn(rows, hk, d, generator=g).to(dtype) for _ in range(2))
        segs = torch.tensor([[1, 40, 0, rows]])
        outs = []
        for threads in (8, 1):  # 8: rows x 3 KV heads < 16, per head; 1: grouped
            monkeypatch.setattr(cpu_kernels, "_threads", lambda t=threads: t)
            keys, values = (c.clone() for c in cached)
            outs.append(cpu_kernels.attend(q, k, v, keys, values, segs, d**-0.5))
        assert torch.equal(outs[0], outs[1]), rows


def test_under_a_passive_wait_only_a_head_sized_multiply_of_few_rows_wakes_the_other_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call of few rows runs on the calling thread (waking a sleeping one costs more than a layer's multiply gains),
    but the vocabulary head streams tens of megabytes and takes every thread (measured 2.38 -> 1.87 ms at one row)."""
    monkeypatch.setattr(cpu_kernels, "_threads", lambda: 2)
    monkeypatch.setitem(cpu_kernels._state, "rows", cpu_kernels.PASSIVE_PARALLEL_ROWS)
    assert cpu_kernels.threads_for(1, torch.bfloat16, 49152 * 576) == 2  # SmolLM2's head
    assert cpu_kernels.threads_for(1, torch.bfloat16, 8192 * 576) == 2  # its draft's frequent head
    assert cpu_kernels.threads_for(1, torch.bfloat16, 3072 * 576) == 1  # a layer's gate/up
    assert cpu_kernels.threads_for(5, torch.bfloat16) == 1  # attention, a verification's rows
    assert cpu_kernels.threads_for(8, torch.bfloat16) == 2


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_argmax_kernel_gives_torch_s_index_ties_nans_and_infinities_included(dtype) -> None:
    """The greedy step's tokens come from cpu_kernels.argmax on the head's logits: each row's index must be
    torch.argmax's (the first of equal maxima, a NaN above every number, the first NaN), on logits as wide as a
    vocabulary and on rows made of ties, signed zeros and infinities."""
    gen = torch.Generator().manual_seed(0)
    wide = (torch.randn(9, 49152, generator=gen) * 4).to(dtype)  # bfloat16: many equal values per row
    wide[3, 100] = wide[3, 40000] = wide[3].max() + 1  # a tie at the top: the first wins
    wide[5, 7] = float("inf")
    wide[6, 20000] = float("nan")
    wide[6, 30000] = float("nan")
    wide[7] = float("-inf")
    edge = torch.tensor(
        [[-0.0, 0.0, -1.0], [float("nan"), 1.0, 2.0], [1.0, float("nan"), float("inf")], [2.0, 5.0, 5.0]], dtype=dtype
    )
    for x in (wide, edge, wide[:, ::2]):  # a strided view too (copied)
        assert cpu_kernels.argmax(x) == x.float().argmax(-1).tolist()
    assert cpu_kernels.argmax(wide)[6] == 20000 and cpu_kernels.argmax(wide)[3] == 100
