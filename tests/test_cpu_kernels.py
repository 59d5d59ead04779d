"""trtspec's float32 CPU kernels (trtspec.runtimes.inflight.cpu_kernels), compiled and run on this machine: the few-row
multiply's results, each row's bits independent of the rows beside it and of the thread count, the elementwise
kernels against torch's ops, the fused step using them, and the switch that turns them off."""

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


@needs_kernel
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it_or_the_threads() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3072, 576, generator=g)
    b = torch.randn(3072, generator=g)
    x = torch.randn(cpu_kernels.MAX_ROWS, 576, generator=g)
    alone = torch.cat([cpu_kernels.linear(x[i : i + 1], w, b) for i in range(len(x))])
    threads = torch.get_num_threads()
    try:
        for t in sorted({1, 2, threads}):
            torch.set_num_threads(t)
            for m in range(1, len(x) + 1):
                assert torch.equal(cpu_kernels.linear(x[:m], w, b), alone[:m]), (m, t)
    finally:
        torch.set_num_threads(threads)
    # an ordinary float32 multiply rounds differently: equality above is the kernel's order, not luck
    assert not torch.equal(torch.nn.functional.linear(x, w, b), alone)


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
def test_attention_over_the_slot_cache_matches_sdpa_and_each_row_is_its_own() -> None:
    g = torch.Generator().manual_seed(2)
    slots, hq, hk, cap, d = 4, 9, 3, 64, 64
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
