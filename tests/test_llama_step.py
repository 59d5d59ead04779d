"""The fused Llama step (trtspec.runtimes.inflight.llama_step) computes what transformers' modules compute, on the
slot KV cache, and the engine's cost measurement runs through it."""

from __future__ import annotations

import pytest
import torch

from tests.tiny import make_llama, make_tokenizer, one_per_pass, pool_with_two_cached
from trtspec.runtimes.inflight.kv_pool import KVGeometry, SlotKVPool
from trtspec.runtimes.inflight.linear import onednn_bf16
from trtspec.runtimes.inflight.llama_step import LlamaStep, step_of, supports
from trtspec.runtimes.inflight.packed import packed_forward, prepare_model
from trtspec.runtimes.torch.costs import batch_step_costs, measure_step_costs, step_cost_ratios


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("step")
    tok = make_tokenizer(root / "tok")
    return prepare_model(AutoModelForCausalLM.from_pretrained(make_llama(root / "m", tok, layers=3)).eval())


@pytest.mark.parametrize("pack_rows", [(), (1, 5)])
def test_fused_step_equals_transformers_on_a_mixed_packed_batch(model, pack_rows):
    """A prefill, a 1-token decode and a 4-token verification in one pass (then a pass over what they wrote):
    the same logits and the same keys/values in every slot as the transformers path."""
    torch.manual_seed(0)
    geometry = KVGeometry.of(model)
    pools = [SlotKVPool(geometry, 3, 64) for _ in range(2)]
    prompts = [torch.randint(0, model.config.vocab_size, (n,)).tolist() for n in (9, 5, 7)]
    step = LlamaStep(model, pack_rows)
    outs = []
    with torch.inference_mode():
        for pool, fast in zip(pools, (None, step)):
            first = packed_forward(model, pool, [(s, 0, p) for s, p in enumerate(prompts)], [8, 13, 20], fast=fast)
            feeds = [(0, 9, [3]), (1, 5, [4, 5, 6, 7]), (2, 7, [8, 9])]
            second = packed_forward(model, pool, feeds, list(range(7)), fast=fast)
            outs.append((first, second))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    for layer in range(geometry.num_layers):
        for s, n in ((0, 10), (1, 9), (2, 9)):
            torch.testing.assert_close(pools[0].keys[layer][s, :, :n], pools[1].keys[layer][s, :, :n])
            torch.testing.assert_close(pools[0].values[layer][s, :, :n], pools[1].values[layer][s, :, :n])


def test_fused_weights_are_the_models_parameters(model):
    """The model's q/k/v parameters are views of the fused weights (no second copy): transformers' own forward (the
    first test's reference) runs on the same memory."""
    step = step_of(model, ())
    assert step is not None and step_of(model, ()) is step
    attn = model.model.layers[0].self_attn
    fused = step.layers[0].qkv.weight
    assert attn.q_proj.weight.data_ptr() == fused.data_ptr()
    assert attn.k_proj.weight.data_ptr() == fused[attn.q_proj.weight.shape[0] :].data_ptr()
    # float32 on a CPU: one oneDNN-packed copy serves every row count (no MKL copy per count)
    packed = step_of(model)
    assert packed is not None
    if torch.backends.mkldnn.is_available():
        assert packed.layers[0].qkv.onednn is not None and not packed.layers[0].qkv.packed


def test_models_outside_the_plain_llama_decoder_keep_the_transformers_path():
    from transformers import MistralConfig, MistralForCausalLM

    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    assert not supports(MistralForCausalLM(MistralConfig(**cfg, sliding_window=16)))
    assert supports(MistralForCausalLM(MistralConfig(**cfg, sliding_window=None)))


def test_cost_ratios_are_measured_through_the_engine_passes(model):
    c, v = step_cost_ratios(model, model, context=16, k=4, tokens_per_step=2.0, reps=3)
    assert c > 0 and v > 0  # timings: their size is for benchmarks/cpu_runtime.py
    costs = measure_step_costs(model, model, context=16, k_max=3, prompt_len=12, reps=3)
    assert sorted(costs.body) == [0, 1, 2, 3] and costs.head > 0 and costs.target_prefill > 0
    assert all(costs.body[k] <= costs.body[k + 1] for k in range(3))  # the isotonic fit: more tokens cost no less
    assert sorted(costs.head_rows) == [1, 2, 3, 4] and all(
        costs.head_rows[n] <= costs.head_rows[n + 1] for n in (1, 2, 3)
    )
    by_batch = batch_step_costs(model, model, context=16, batches=(1, 3), ks=(1, 4), reps=3)
    assert sorted(by_batch) == [1, 3]
    for row in by_batch.values():
        assert row["step_s"] > 0 and row["c"] > 0 and sorted(row["v"]) == [1, 4] and min(row["v"].values()) > 0


@pytest.fixture(scope="module")
def bf16_pair(tmp_path_factory):
    """A tiny bfloat16 target whose MLP reduces over 1536 inputs (past INVARIANT_REDUCTION, where oneDNN's multiply
    rounds rows differently by row count) and a noisy copy of it as draft."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("bf16")
    tok = make_tokenizer(root / "tok")
    path = make_llama(root / "m", tok, layers=2, intermediate=1536)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    draft = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_((torch.randn(p.shape, generator=gen) * 0.002).to(p.dtype))
    return prepare_model(target), prepare_model(draft)


@pytest.mark.skipif(not onednn_bf16(), reason="no oneDNN bfloat16 on this CPU: bfloat16 takes the plain path")
@pytest.mark.parametrize("multiply", ["trtspec's kernel", "oneDNN pieces"])
def test_bfloat16_rows_get_the_same_bits_whatever_else_is_in_the_pass(bf16_pair, multiply, monkeypatch):
    """A sequence's 5 tokens after 700 cached ones give bit-identical hidden states fed one per pass (decoding), all
    in one pass (verification), or packed beside a prefill and a decode of other sequences (in-flight batching), with
    trtspec's bfloat16 multiply and without it (TRTSPEC_CPU_KERNELS=0: oneDNN on split reductions). Without the split
    multiplies, or with scaled_dot_product_attention, this fails here (checked)."""
    from trtspec.runtimes.inflight import cpu_kernels
    from trtspec.runtimes.inflight.linear import INVARIANT_REDUCTION, row_invariant

    if multiply == "oneDNN pieces":
        monkeypatch.setenv("TRTSPEC_CPU_KERNELS", "0")
    elif not cpu_kernels.available():
        pytest.skip("trtspec's CPU kernels do not run here")
    target = bf16_pair[0]
    step = LlamaStep(target)
    assert step.invariant and row_invariant(step.embed)
    if multiply == "oneDNN pieces":
        assert any(layer.down.pieces for layer in step.layers)  # 1536 inputs > INVARIANT_REDUCTION: split
    else:
        assert all(layer.down.every_row and not layer.down.pieces for layer in step.layers)
    assert target.config.intermediate_size > INVARIANT_REDUCTION
    torch.manual_seed(0)
    vocab = target.config.vocab_size
    prompt, tail = torch.randint(0, vocab, (700,)), torch.randint(0, vocab, (5,))
    other = torch.randint(0, vocab, (40,))
    results = []
    with torch.inference_mode():
        for how in ("one per pass", "one pass", "packed with others", "beside a long prefill"):
            pool = pool_with_two_cached(step, target, prompt, other, 1024)
            if how == "one per pass":
                results.append(one_per_pass(step, pool, tail, 700))
            elif how == "one pass":
                results.append(step.body(pool, [(0, 700, 0, 5)], tail, torch.arange(700, 705)))
            else:  # slot 1: a prefill (17 tokens, or 100: a pass that attends on every thread), slot 0: the 5
                # tokens, slot 2: one decode token
                m = 17 if how == "packed with others" else 100
                ids = torch.cat([torch.randint(0, vocab, (m,)), tail, torch.randint(0, vocab, (1,))])
                pos = torch.cat([torch.arange(m), torch.arange(700, 705), torch.tensor([40])])
                out = step.body(pool, [(1, 0, 0, m), (0, 700, m, 5), (2, 40, m + 5, 1)], ids, pos)
                results.append(out[m : m + 5])
    assert results[0].dtype == torch.bfloat16
    for other_result in results[1:]:
        assert torch.equal(results[0], other_result)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_whole_pass_in_one_call_equals_the_kernels_called_one_by_one(bf16_pair, model, dtype, monkeypatch):
    """cpu_kernels.whole_pass runs every layer's kernels from C in the order the step calls them from Python: the
    same hidden states and the same keys and values written into every layer's cache, bit for bit, whether each
    kernel takes its own threads or one OpenMP region of 2 or 3 threads deals every step between them (3: shares of
    unequal size, more threads than this machine's cores). bfloat16: a pass that packs a prefill, a verification
    and a decode (and the passes that cached the prompts); float32, whose kernels take passes of at most MAX_ROWS
    tokens: a verification and a decode (the prompts cached one by one)."""
    from trtspec.runtimes.inflight import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("trtspec's CPU kernels do not run here")
    target = bf16_pair[0] if dtype == "bfloat16" else model
    torch.manual_seed(1)
    vocab = target.config.vocab_size
    prompt, other = torch.randint(0, vocab, (300,)), torch.randint(0, vocab, (40,))
    m = 17 if dtype == "bfloat16" else 0  # the prefill's tokens in the pass
    ids = torch.randint(0, vocab, (m + 6,))
    pos = torch.cat([torch.arange(m), torch.arange(300, 305), torch.tensor([40])])
    segments = [(1, 0, 0, m), (0, 300, m, 5), (2, 40, m + 5, 1)][0 if m else 1 :]
    results = {}
    teams: list[int] = []
    whole_pass = cpu_kernels.whole_pass
    with torch.inference_mode():
        for mode in (0, 1, 2, 3):  # 0: one by one; else the whole pass with a team of that many threads
            monkeypatch.setattr(cpu_kernels, "pass_team", lambda _m=mode: max(1, _m))
            step = LlamaStep(target)
            assert step.whole_pass and step.one_region  # where trtspec's kernels run, the defaults
            step.whole_pass = mode > 0
            calls: list[int] = []
            if mode:  # the pass under test must go through the one call, with its team (whole_pass's last argument)
                monkeypatch.setattr(
                    cpu_kernels, "whole_pass", lambda *a, _c=calls, _f=whole_pass: _c.append(a[-1]) or _f(*a)
                )
            if m:
                pool = pool_with_two_cached(step, target, prompt, other, 512)
            else:
                pool = SlotKVPool(KVGeometry.of(target), 3, 512)
                for slot, tokens in ((0, prompt), (2, other)):
                    for i in range(len(tokens)):
                        step.body(pool, [(slot, i, 0, 1)], tokens[i : i + 1], torch.tensor([i]))
            calls.clear()
            out = step.body(pool, segments, ids, pos)
            teams += calls
            results[mode] = (out, [k.clone() for k in pool.keys], [v.clone() for v in pool.values])
    assert teams == [1, 2, 3]
    b, bk, bv = results[0]
    for mode in (1, 2, 3):
        a, ak, av = results[mode]
        assert a.dtype == getattr(torch, dtype) and torch.equal(a, b), mode
        for layer in range(len(ak)):  # the slots' written positions (the rest of the pool is uninitialised memory)
            for slot, upto in ((0, 305), (1, m), (2, 41)):
                assert torch.equal(ak[layer][slot, :, :upto], bk[layer][slot, :, :upto]), (mode, layer, slot)
                assert torch.equal(av[layer][slot, :, :upto], bv[layer][slot, :, :upto]), (mode, layer, slot)


def test_a_pass_past_its_slot_is_refused_before_the_kernels_write(model):
    """trtspec's kernels write each segment's keys and values at (slot, past .. past + count) unchecked: a segment
    beyond the pool's slots or capacity must raise a clear error, not write past the caches."""
    from trtspec.errors import GenerationError

    step = LlamaStep(model)
    pool = SlotKVPool(KVGeometry.of(model), 2, 16)
    ids = torch.randint(0, model.config.vocab_size, (4,))
    with torch.inference_mode():
        for segments, pos in (([(0, 14, 0, 4)], torch.arange(14, 18)), ([(2, 0, 0, 4)], torch.arange(4))):
            with pytest.raises(GenerationError, match="KV pool of 2 slots x 16"):
                step.body(pool, segments, ids, pos)
        with pytest.raises(GenerationError, match="outside its pass of 4 tokens"):
            step.body(pool, [(0, 0, 2, 4)], ids, torch.arange(4))
        step.body(pool, [(0, 12, 0, 4)], ids, torch.arange(12, 16))  # up to the last position: fine


def test_bfloat16_without_onednn_takes_the_plain_path(bf16_pair, monkeypatch):
    """On a CPU where oneDNN has no bfloat16 kernel (AVX2 only) the step must not ask for one (it raised there:
    "bf16 path needs the cpu support avx_ne_convert or avx512bw ..."): trtspec's kernels where they run, else
    torch's plain multiplies and attention, the same logits as transformers' own forward within bfloat16 rounding."""
    from trtspec.runtimes.inflight import linear

    monkeypatch.setattr(linear, "_ONEDNN_BF16", False)
    target = bf16_pair[0]
    step = LlamaStep(target)
    assert not step.invariant and not any(layer.down.pieces or layer.down.packed for layer in step.layers)
    ids = torch.randint(0, target.config.vocab_size, (9,))
    pool = SlotKVPool(KVGeometry.of(target), 1, 32)
    with torch.inference_mode():
        ours = packed_forward(target, pool, [(0, 0, ids.tolist())], list(range(9)), fast=step)
        ref = target(ids.unsqueeze(0)).logits[0]
    torch.testing.assert_close(ours.float(), ref.float(), atol=0.05, rtol=0.05)


def test_bfloat16_greedy_speculative_equals_target_only_batched_and_not(bf16_pair):
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder

    target, draft = bf16_pair
    torch.manual_seed(1)
    prompts = [torch.randint(0, target.config.vocab_size, (n,)).tolist() for n in (7, 19, 3, 12)]
    alone = [SpeculativeDecoder(target, None).generate([p], 40)[0].token_ids for p in prompts]
    dec = SpeculativeDecoder(target, draft, max_draft_len=4)
    assert [dec.generate([p], 40)[0].token_ids for p in prompts] == alone
    batch = dec.generate(prompts, 40)
    assert [r.token_ids for r in batch] == alone
    assert 0.1 < sum(r.stats.acceptance_rate for r in batch) / len(batch) < 1.0  # drafts were partly rejected


def test_float32_decode_and_verification_rows_of_several_sequences_attend_in_one_call(model, monkeypatch):
    """Short segments of several slots (decoding, verification) go through one batched attention call per layer and
    give what each segment gives alone, also when the pool's memory past the sequences holds NaN (never-written
    memory can: a masked position is still multiplied by its zero weight); a prefill keeps its own call."""
    from trtspec.runtimes.inflight import row_attention

    step = step_of(model)
    assert step is not None
    torch.manual_seed(3)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (n,)) for n in (11, 5, 23, 8)]
    feeds = [[3], [4, 5, 6, 7, 8], [9], [10, 11]]
    results = []
    for batched in (True, False):
        pool = SlotKVPool(KVGeometry.of(model), 5, 64)
        for keys, values in zip(pool.keys, pool.values):
            keys.fill_(float("nan"))
            values.fill_(float("nan"))
        with torch.inference_mode():
            for s, p in enumerate(prompts):
                step.body(pool, [(s, 0, 0, len(p))], p, torch.arange(len(p)))
            segs, ids, pos, a = [], [], [], 0
            for s, (p, f) in enumerate(zip(prompts, feeds)):
                segs.append((s, len(p), a, len(f)))
                ids += f
                pos += list(range(len(p), len(p) + len(f)))
                a += len(f)
            plan = row_attention.BatchedSegments.of(segs, "cpu")
            assert plan is not None and set(plan.members) == {0, 1, 2, 3}
            if not batched:
                monkeypatch.setattr(row_attention, "BATCHED_QUERIES", 0)
                assert row_attention.BatchedSegments.of(segs, "cpu") is None
            results.append(step.body(pool, segs, torch.tensor(ids), torch.tensor(pos)))
    assert not results[0].isnan().any()
    torch.testing.assert_close(results[0], results[1], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not onednn_bf16(), reason="no oneDNN bfloat16 on this CPU: bfloat16 takes the plain path")
def test_bfloat16_verification_rows_across_1024_keys_equal_decoding_them():
    """A verification whose rows see 1013 to 1028 keys (SmolLM2-135M's heads: 9 of 64, 3 kv heads) gives each row the
    bits of decoding it alone. With the keys in one piece (one bmm over all 1028) 21 outputs differed here over these
    8 draws (sharp attention weights make the rounding show); in INVARIANT_REDUCTION pieces none do."""
    from trtspec.runtimes.inflight.row_attention import row_attention

    hq, hk, d, scaling, past, n = 9, 3, 64, 64**-0.5, 1012, 16
    gen = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a decode or verification pass attends (SMALL_PASS)
    try:
        with torch.inference_mode():
            for _ in range(8):
                keys = torch.randn(hk, past + n, d, generator=gen).to(torch.bfloat16)
                values = torch.randn(hk, past + n, d, generator=gen).to(torch.bfloat16)
                q = (torch.randn(n, hq, d, generator=gen) * 3.0).to(torch.bfloat16)
                together = row_attention(q, keys, values, past, scaling)
                for i in range(n):
                    end = past + i + 1
                    alone = row_attention(q[i : i + 1], keys[:, :end], values[:, :end], past + i, scaling)
                    assert torch.equal(together[i : i + 1], alone), f"row {i} ({end} keys)"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not onednn_bf16(), reason="no oneDNN bfloat16 on this CPU: bfloat16 takes the plain path")
def test_bfloat16_short_segments_of_several_sequences_attend_at_once_with_the_bits_of_each_alone(bf16_pair):
    """Decoding and verification rows of sequences of different lengths (some past INVARIANT_REDUCTION keys, one
    crossing it within its verification, a slot between them empty) go through one batched attention call per
    layer, padded to the longest, with never-written memory holding NaN: every row's hidden state equals bit for bit
    what the same sequence gets alone in its pass, and what decoding it one token per pass gives. Without the keys in
    INVARIANT_REDUCTION pieces (_weighted_values) this fails here (checked)."""
    from trtspec.runtimes.inflight.row_attention import BatchedSegments

    target = bf16_pair[0]
    step = step_of(target)
    assert step is not None and step.invariant
    g = step.heads // step.kv_heads
    torch.manual_seed(4)
    vocab = target.config.vocab_size
    # slot: (cached tokens, new tokens); slot 3 holds nothing
    plan = {0: (1021, 5), 1: (300, 1), 2: (1500, 3), 4: (40, 16), 5: (7, 1)}
    prompts = {s: torch.randint(0, vocab, (p,)) for s, (p, _) in plan.items()}
    feeds = {s: torch.randint(0, vocab, (n,)) for s, (_, n) in plan.items()}

    def filled_pool() -> SlotKVPool:
        pool = SlotKVPool(KVGeometry.of(target), 6, 1600)
        for keys, values in zip(pool.keys, pool.values):
            keys.fill_(float("nan"))
            values.fill_(float("nan"))
        for s, p in prompts.items():
            step.body(pool, [(s, 0, 0, len(p))], p, torch.arange(len(p)))
        return pool

    with torch.inference_mode():
        pool = filled_pool()
        alone = {s: step.body(pool, [(s, p, 0, n)], feeds[s], torch.arange(p, p + n)) for s, (p, n) in plan.items()}
        pool = filled_pool()
        one_per_pass = {
            s: torch.cat(
                [step.body(pool, [(s, p + i, 0, 1)], feeds[s][i : i + 1], torch.tensor([p + i])) for i in range(n)]
            )
            for s, (p, n) in plan.items()
        }
        pool = filled_pool()
        segs, ids, pos, a = [], [], [], 0
        for s, (p, n) in plan.items():
            segs.append((s, p, a, n))
            ids.append(feeds[s])
            pos.append(torch.arange(p, p + n))
            a += n
        batched = BatchedSegments.of(segs, "cpu", g)
        assert batched is not None and len(batched.members) == len(plan) and batched.hidden is not None
        out = step.body(pool, segs, torch.cat(ids), torch.cat(pos))
    assert not out.isnan().any()
    for s, _, a, n in segs:
        assert torch.equal(out[a : a + n], alone[s]), f"slot {s}: batched rows differ from the sequence alone"
        assert torch.equal(alone[s], one_per_pass[s]), f"slot {s}: verification rows differ from decoding"


@pytest.mark.skipif(not onednn_bf16(), reason="no oneDNN bfloat16 on this CPU: bfloat16 takes the plain path")
def test_bfloat16_batched_attention_rows_equal_each_sequence_alone_at_the_examples_geometry():
    """The batched attention itself (BatchedSegments' plan and mask, batched_row_attention) at SmolLM2-135M's heads (9
    of 64, 3 kv heads), over batches of 8 sequences of 17 to 2916 keys, on one thread or two: every row's bits equal
    row_attention's for its sequence alone (queries and keys unpadded, one thread). oneDNN's reordered sums show in few
    bfloat16 outputs (about 1 in 4 000 here, with sharp attention weights, rows of about 1000 keys padded to 2916), so
    this looks at about 400 000: with the keys in one piece instead of INVARIANT_REDUCTION pieces, rows differ here
    (checked)."""
    from trtspec.runtimes.inflight.row_attention import BatchedSegments, batched_row_attention, row_attention

    hq, hk, d, scaling = 9, 3, 64, 64**-0.5
    gen = torch.Generator().manual_seed(0)
    lengths, widths = [1000, 1021, 2900, 300, 17, 800, 1100, 990], [5, 5, 16, 16, 16, 1, 16, 5]

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)

    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            for rnd in range(8):
                keys, values = randn(8, hk, 2940, d), randn(8, hk, 2940, d)
                q = randn(sum(widths), hq, d, scale=3.0)  # sharp weights: rounding shows more often
                segs = [(s, p, sum(widths[:s]), n) for s, (p, n) in enumerate(zip(lengths, widths))]
                plan = BatchedSegments.of(segs, "cpu", hq // hk)
                assert plan is not None and plan.hidden is not None
                qp = q.new_zeros(plan.rows, plan.width, hq, d)
                qp[plan.row_i, plan.query_i] = q[plan.src]
                view = slice(plan.lo, plan.lo + plan.rows), slice(None), slice(None, plan.length)
                # one thread as a decode or verification pass attends (SMALL_PASS), two as a pass beside a prefill
                torch.set_num_threads(1 + rnd % 2)
                o = batched_row_attention(qp, keys[view], values[view], plan.hidden, scaling)[plan.row_i, plan.query_i]
                torch.set_num_threads(1)
                for s, p, a, n in segs:
                    alone = row_attention(q[a : a + n], keys[s, :, : p + n], values[s, :, : p + n], p, scaling)
                    assert torch.equal(o[a : a + n], alone), f"{n} rows after {p} keys"
    finally:
        torch.set_num_threads(threads)
