"""The thread policy's timed choice (trtspec.runtimes.torch.costs.fastest_threads): the faster of one thread and one
per core, left set, and the same greedy tokens whichever it picks."""

from __future__ import annotations

import os

import pytest


@pytest.mark.slow
def test_the_timed_thread_count_is_the_faster_and_decodes_the_same_tokens(tiny_pair):
    import torch

    from trtspec.runtimes.torch.costs import fastest_threads
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder
    from trtspec.runtimes.torch.loading import load_model

    target = load_model(tiny_pair[0])
    before = torch.get_num_threads()
    try:
        best, medians = fastest_threads(target, context=32, reps=3)
        cores = os.cpu_count() or 1
        if cores == 1:
            assert medians == {}
            return
        assert set(medians) == {1, cores} and all(t > 0 for t in medians.values())
        assert medians[best] == min(medians.values()) and torch.get_num_threads() == best
        dec = SpeculativeDecoder(target, None, max_draft_len=4, drafter="ngram")
        prompt = [5, 9, 11, 5, 9, 11, 5, 9]
        texts = {}
        for n in sorted(medians):
            torch.set_num_threads(n)
            texts[n] = [dec.generate([prompt], 24, use_draft=use)[0].token_ids for use in (False, True)]
        assert texts[1] == texts[cores] and texts[1][0] == texts[1][1]
    finally:
        torch.set_num_threads(before)


def test_a_served_model_leaves_cores_to_the_server_and_with_none_left_takes_one_thread_untimed(tiny_pair):
    """The BLS orchestration's served engine models pass ``reserve=SERVED_RESERVE``: the many-thread candidate is one
    per core less the reserve, and where that leaves one core (the 2-core machines here) the choice is one thread,
    without timing."""
    import torch

    from trtspec.runtimes.torch.costs import SERVED_RESERVE, fastest_threads
    from trtspec.runtimes.torch.loading import load_model

    target = load_model(tiny_pair[0])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        best, medians = fastest_threads(target, context=32, reps=1, reserve=(os.cpu_count() or 1) - 1)
        assert (best, medians) == (1, {}) and torch.get_num_threads() == 1
        if (os.cpu_count() or 1) <= 1 + SERVED_RESERVE:  # these machines: what the served models get
            torch.set_num_threads(max(1, os.cpu_count() or 1))
            assert fastest_threads(target, context=32, reps=1, reserve=SERVED_RESERVE) == (1, {})
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_openmp_waits_passively_only_without_a_spin_count() -> None:
    from trtspec.threads import waits_passively

    assert waits_passively({"OMP_WAIT_POLICY": "PASSIVE"}) and waits_passively({"OMP_WAIT_POLICY": "passive "})
    assert not waits_passively({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"})
    assert not waits_passively({"OMP_WAIT_POLICY": "ACTIVE"}) and not waits_passively({})


@pytest.mark.parametrize(
    "env, rows",
    [
        ({"OMP_WAIT_POLICY": "PASSIVE"}, "passive"),
        ({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}, 1),
        ({}, 1),
        ({"OMP_WAIT_POLICY": "PASSIVE", "TRTSPEC_PARALLEL_ROWS": "3"}, 3),
        ({"TRTSPEC_PARALLEL_ROWS": "16"}, 16),
    ],
)
def test_a_kernel_call_of_few_rows_takes_one_thread_only_where_threads_sleep(monkeypatch, env, rows) -> None:
    """Under a passive wait each parallel call wakes a sleeping thread (tens of microseconds on a VM): calls of fewer
    rows than parallel_rows() run on the calling thread; a spinning runtime's calls take every thread."""
    import torch

    from trtspec.runtimes.inflight import cpu_kernels

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TRTSPEC_PARALLEL_ROWS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delitem(cpu_kernels._state, "rows", raising=False)
    expected = cpu_kernels.PASSIVE_PARALLEL_ROWS if rows == "passive" else rows
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert cpu_kernels.parallel_rows() == expected and cpu_kernels.parallel_rows(torch.float32) == 1
        assert cpu_kernels.threads_for(expected) == 2 and cpu_kernels.threads_for(10_000) == 2
        assert expected == 1 or cpu_kernels.threads_for(expected - 1) == 1
    finally:
        torch.set_num_threads(before)
        cpu_kernels._state.pop("rows", None)


def test_only_bfloat16_multiplies_of_few_rows_run_on_the_calling_thread(monkeypatch) -> None:
    """The rule is for the bfloat16 kernels it was measured on: a float32 call keeps every thread (one thread verified
    5 float32 tokens 1.08x slower)."""
    import torch

    from trtspec.runtimes.inflight import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no AVX2/FMA x86-64 CPU or no C compiler here")
    seen = []
    for name in ("trtspec_linear_bf16", "trtspec_linear_f32"):
        real = cpu_kernels._kernel(name)

        def record(*args, real=real):
            seen.append(args[-1])  # the thread count
            return real(*args)

        monkeypatch.setitem(cpu_kernels._state, name, record)
    monkeypatch.setitem(cpu_kernels._state, "rows", 8)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        w = torch.randn(64, 64)
        for dtype, rows in ((torch.bfloat16, 1), (torch.bfloat16, 7), (torch.bfloat16, 8), (torch.float32, 1)):
            cpu_kernels.linear(torch.randn(rows, 64).to(dtype), w.to(dtype))
        assert seen == [1, 1, 2, 2]
    finally:
        torch.set_num_threads(before)
