"""The torch runtime's serving engine: TRT-LLM request semantics, in-flight batching, slot KV cache with prefix reuse.

Reference outputs come from transformers' own generate (no trtspec code).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from trtspec.errors import GenerationError
from trtspec.runtimes.inflight.contract import decode_word_list, encode_word_list, format_output, parse_request
from trtspec.runtimes.inflight.engine import InflightEngine
from trtspec.runtimes.inflight.jobs import Job
from trtspec.runtimes.inflight.kv_pool import KVGeometry, SlotKVPool
from trtspec.runtimes.torch.loading import load_model
from trtspec.speculative.sampling import SamplingParams

EOS = 2


@pytest.fixture(scope="module")
def target(tiny_pair):
    return load_model(tiny_pair[0])


@pytest.fixture(scope="module")
def engine(tiny_pair):
    eng = InflightEngine(load_model(tiny_pair[0]), max_batch_size=8, slots=12, capacity=256).start()
    yield eng
    eng.stop()


def reference(model, prompt, n):
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=EOS, pad_token_id=3
        )[0, len(prompt) :].tolist()
    return out[: out.index(EOS)] if EOS in out else out


def submit(engine, **kw):
    """Submit a job; return (done event, chunks list, errors list)."""
    done, chunks, errors = threading.Event(), [], []

    def on_tokens(tokens, logits, final):
        chunks.append((tokens, logits))
        if final:
            done.set()

    def on_error(exc):
        errors.append(exc)
        done.set()

    kw.setdefault("end_id", EOS)
    engine.submit(Job(on_tokens=on_tokens, on_error=on_error, **kw))
    return done, chunks, errors


def run(engine, **kw):
    done, chunks, errors = submit(engine, **kw)
    assert done.wait(60)
    if errors:
        raise errors[0]
    return [t for c, _ in chunks for t in c], chunks


PROMPTS = [list(range(10, 10 + 3 * i + 2)) for i in range(8)]


def test_concurrent_greedy_generation_equals_transformers_and_shares_passes(engine, target):
    refs = [reference(target, p, 16) for p in PROMPTS]
    passes = engine.passes
    jobs = [submit(engine, tokens=p, max_new=16, stream=i % 2 == 0) for i, p in enumerate(PROMPTS)]
    for (done, chunks, errors), ref, i in zip(jobs, refs, range(8)):
        assert done.wait(60) and not errors
        assert [t for c, _ in chunks for t in c] == ref
        if i % 2 == 0:  # streaming: one response per token (plus the final one)
            assert len(chunks) >= len(ref)
    # 8 requests x up to 16 tokens ran in shared passes, not one pass per token of each request.
    assert engine.passes - passes < sum(len(r) for r in refs)


def test_verification_returns_accepted_drafts_plus_target_token_and_drops_rejected(engine, target):
    p = PROMPTS[3]
    ref = reference(target, p, 10)
    wrong = (ref[2] + 1) % 300
    out, _ = run(engine, tokens=p, max_new=5, draft=[ref[0], ref[1], wrong, ref[3]])
    assert out == ref[:3]  # two accepted, then the target's own token instead of the wrong draft
    # The next step continues the sequence: the rejected token's keys must not leak into it.
    out, _ = run(engine, tokens=p + ref[:3], max_new=5, draft=ref[3:7])
    assert out == ref[3:8]  # all accepted plus the bonus token


def test_a_step_that_extends_a_cached_sequence_computes_only_the_new_tokens(tiny_pair, target):
    eng = InflightEngine(load_model(tiny_pair[0]), max_batch_size=2, slots=4, capacity=256).start()
    try:
        prompt = list(range(20, 120))
        first, _ = run(eng, tokens=prompt, max_new=3)
        before = eng.pool.computed_tokens
        second, _ = run(eng, tokens=prompt + first, max_new=1)
        # The slot holds the prompt and the generated tokens it fed (all but the last): one token to compute, not 103.
        assert eng.pool.computed_tokens - before == 1
        assert second == reference(target, prompt, 4)[3:4]
    finally:
        eng.stop()


def test_lru_keeps_memory_bounded_and_copies_a_shared_prefix_instead_of_stealing(target):
    pool = SlotKVPool(KVGeometry.of(target), slots=3, capacity=64)
    a, n = pool.acquire(list(range(60)))
    assert n == 0
    a.tokens = list(range(60))
    pool.release(a)
    # A different continuation of a long shared prefix: copied into another slot, the cached sequence stays intact.
    b, n = pool.acquire(list(range(30)) + [99, 98])
    assert n == 30 and b is not a and a.tokens == list(range(60)) and pool.copied_tokens == 30
    pool.release(b)
    # The same sequence extended: its own slot, no copy.
    c, n = pool.acquire(list(range(62)))
    assert c is a and n == 60
    pool.release(c)
    assert len(pool.slots) == 3 and pool.keys[0].shape[0] == 3  # bounded: never more slots than configured


@pytest.mark.parametrize("with_logits", [False, True])
def test_sampled_verification_follows_the_target_distribution(engine, target, with_logits):
    """One verify step: a fixed draft token as a point mass, or a draft token sampled from draft logits q (rejection
    sampling against q): the first emitted token must be distributed as the target's p, whatever the draft."""
    p = PROMPTS[1]
    params = SamplingParams(temperature=1.0, top_k=4)
    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([p])).logits[0, -1]
    from trtspec.speculative.sampling import logits_to_probs

    probs = logits_to_probs(logits, params)
    support = torch.nonzero(probs).flatten().tolist()
    draft_token = support[-1]  # the least likely token of the top 4
    n = 1200
    # Draft logits on the same support but favouring the least likely token: q differs from p.
    q_logits = torch.full((1, logits.shape[-1]), float("-inf"))
    q_logits[0, support] = torch.tensor([0.0, 1.0, 2.0, 3.0])
    q = logits_to_probs(q_logits[0], params)
    gen = torch.Generator().manual_seed(1234)
    drafts = torch.multinomial(q, n, replacement=True, generator=gen).tolist() if with_logits else [draft_token] * n
    jobs = [
        submit(
            engine,
            tokens=p,
            max_new=2,
            draft=[drafts[i]],
            sampling=params,
            draft_logits=q_logits if with_logits else None,
            generator=torch.Generator().manual_seed(i),
        )
        for i in range(n)
    ]
    counts = {t: 0 for t in support}
    for done, chunks, errors in jobs:
        assert done.wait(60) and not errors
        counts[chunks[-1][0][0]] += 1
    for t in support:
        expected = float(probs[t]) * n
        sd = (float(probs[t]) * (1 - float(probs[t])) * n) ** 0.5
        assert abs(counts[t] - expected) < 5 * sd + 3, (t, counts[t], expected)


def test_end_id_stop_words_and_bad_words(engine, target):
    p = PROMPTS[5]
    ref = reference(target, p, 12)
    stop = ref[3:5]
    first = next(j for j in range(2, len(ref) + 1) if ref[j - 2 : j] == stop)
    out, _ = run(engine, tokens=p, max_new=12, stop_words=[stop])
    assert out == ref[:first]  # stops after the first occurrence of the stop word, which is returned (TRT-LLM)
    out, _ = run(engine, tokens=p, max_new=3, bad_words=[[ref[0]]])
    assert out[0] != ref[0]
    end = ref[3]  # any token can be the end id: generation stops before it, and it is not returned
    out, _ = run(engine, tokens=p, max_new=12, end_id=end)
    assert out == ref[: ref.index(end)]
    out, _ = run(engine, tokens=p, max_new=6, draft=ref[:5], end_id=end)
    assert out == ref[: ref.index(end)]


def test_requests_the_engine_cannot_serve_are_refused_before_queueing(engine):
    for kw, msg in (
        (dict(tokens=[], max_new=3), "empty"),
        (dict(tokens=[1, 2], max_new=0), "> 0"),
        (dict(tokens=[1, 99999], max_new=3), "vocabulary"),
        (dict(tokens=list(range(10, 250)), max_new=40), "max_seq_len"),
    ):
        with pytest.raises(GenerationError, match=msg):
            engine.submit(Job(on_tokens=lambda *a: None, on_error=lambda e: None, **kw))
    out, _ = run(engine, tokens=PROMPTS[0], max_new=2)  # still serving
    assert len(out) == 2


def test_trtllm_tensor_contract_parse_and_format():
    words = [[5, 6], [7]]
    assert decode_word_list(encode_word_list(words)) == words
    inputs = {
        "input_ids": np.array([[1, 2, 3, 0], [4, 5, 6, 7]], dtype=np.int32),
        "input_lengths": np.array([3, 4], dtype=np.int32),
        "request_output_len": np.array([5, 6], dtype=np.int32),
        "end_id": np.array([2, 2], dtype=np.int32),
        "runtime_top_k": np.array([1, 0], dtype=np.int32),
        "temperature": np.array([0.7, 0.7], dtype=np.float32),
        "stop_words_list": np.stack([encode_word_list(words), encode_word_list([])[:, :1].repeat(3, 1)]),
        "streaming": np.array([True, False]),
    }
    rows = parse_request(inputs)
    assert rows[0].tokens == [1, 2, 3] and rows[1].tokens == [4, 5, 6, 7]
    assert rows[0].sampling.temperature == 0.0  # top_k 1 means greedy in TRT-LLM
    assert rows[1].sampling.temperature == pytest.approx(0.7)
    assert rows[0].stop_words == words and rows[1].stop_words == []
    assert rows[0].stream and not rows[1].stream
    out = format_output([9, 8], prompt=[1, 2, 3])
    assert out["output_ids"].tolist() == [[[1, 2, 3, 9, 8]]] and out["sequence_length"].tolist() == [[5]]
    with pytest.raises(GenerationError, match="beam_width"):
        parse_request({**inputs, "beam_width": np.array([2, 2], dtype=np.int32)})


def test_a_distilled_draft_serves_packed_batches_like_a_llama(tiny_pair, target):
    """The in-flight engine asks for logits at packed indices (a tensor logits_to_keep): the trtspec_draft model must
    give what it gives one sequence at a time (it once sliced with the tensor as a count: wrong rows, or an error)."""
    import copy

    from trtspec.distill.data import select_head_tokens
    from trtspec.distill.model import draft_from_target

    draft = draft_from_target(target, [0, 1], select_head_tokens(torch.ones(512, dtype=torch.long), 256)).eval()
    expected = [reference(draft, p, 6) for p in PROMPTS[:4]]  # before the engine takes the model over
    eng = InflightEngine(copy.deepcopy(draft), max_batch_size=8, slots=12, capacity=256).start()
    try:
        dones = [submit(eng, tokens=p, max_new=6) for p in PROMPTS[:4]]  # together: one packed pass per step
        for ref, (done, chunks, errors) in zip(expected, dones):
            assert done.wait(60) and not errors, errors
            assert [t for c, _ in chunks for t in c] == ref
    finally:
        eng.stop()
