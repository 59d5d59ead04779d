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


def test_turned_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTSPEC_CPU_KERNELS", "0")
    assert not cpu_kernels.available()
    assert not cpu_kernels.applies(torch.zeros(4, 8))
