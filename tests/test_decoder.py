"""The speculative decoder on tiny random models: lossless greedy output, rollback, stops, statistics, bad input."""

from __future__ import annotations

import pytest
import torch

from trtspec.errors import GenerationError, IncompatibleModelsError
from trtspec.runtimes.torch.decoder import SpeculativeDecoder
from trtspec.runtimes.torch.loading import load_model, load_tokenizer

PROMPTS = ["The quick brown", "def add(a, b):\n    return a", "Q: What is the capital of France? A:", "Z"]


@pytest.fixture(scope="module")
def models(tiny_pair):
    target = load_model(tiny_pair[0])
    draft = load_model(tiny_pair[1])
    # A draft that agrees with the target part of the time: the target with noise on its weights.
    noisy = load_model(tiny_pair[0])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.0015)
    tok = load_tokenizer(tiny_pair[0])
    return target, draft, noisy, tok


@pytest.fixture(scope="module")
def prompts(models):
    tok = models[3]
    return [tok.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(models, prompts):
    """Target-only greedy from transformers' own generate (no trtspec code)."""
    target = models[0]
    out = []
    for p in prompts:
        ids = target.generate(
            torch.tensor([p]), max_new_tokens=48, do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=48
        )
        out.append(ids[0, len(p) :].tolist())
    return out


def test_no_draft_path_equals_transformers_greedy(models, prompts, reference):
    dec = SpeculativeDecoder(models[0], None)
    assert [r.token_ids for r in dec.generate(prompts, 48)] == reference


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("which", ["noisy", "random"])
def test_greedy_speculative_equals_target_greedy_batch1_and_batch4(models, prompts, reference, k, which):
    target, draft, noisy, _ = models
    dec = SpeculativeDecoder(target, noisy if which == "noisy" else draft, max_draft_len=k)
    for p, ref in zip(prompts, reference):
        assert dec.generate([p], 48)[0].token_ids == ref
    batch = dec.generate(prompts, 48)
    assert [r.token_ids for r in batch] == reference
    if which == "noisy":
        rates = [r.stats.acceptance_rate for r in batch]
        # Rows accept different counts per step: the case batching with holes exists for.
        assert 0.2 < sum(rates) / len(rates) < 1.0, rates


def test_batch_with_different_max_tokens_and_lengths(models, prompts, reference):
    target, _, noisy, _ = models
    dec = SpeculativeDecoder(target, noisy, max_draft_len=4)
    for n in (1, 2, 5, 13):
        assert [r.token_ids for r in dec.generate(prompts, n)] == [ref[:n] for ref in reference]


def test_eos_inside_a_draft_window_stops_exactly_where_target_would(models, prompts, reference):
    target = models[0]
    ref = reference[0]
    stop = ref[10]
    first = ref.index(stop)
    # draft == target accepts every proposal, so the stop token arrives in the middle of a K = 8 window.
    dec = SpeculativeDecoder(target, target, max_draft_len=8, eos_ids=[stop])
    r = dec.generate([prompts[0]], 48)[0]
    assert r.token_ids == ref[: first + 1]
    assert r.finish_reason == "stop"
    alone = SpeculativeDecoder(target, None, eos_ids=[stop]).generate([prompts[0]], 48)[0]
    assert alone.token_ids == r.token_ids
    batch = dec.generate(prompts, 48)
    assert batch[0].token_ids == r.token_ids


def test_stats_are_consistent(models, prompts):
    target, _, noisy, _ = models
    dec = SpeculativeDecoder(target, noisy, max_draft_len=4)
    r = dec.generate([prompts[1]], 40)[0]
    s = r.stats
    assert s.num_output_tokens == 40 == len(r.token_ids)
    assert 0 < s.total_accepted_draft_tokens <= s.total_draft_tokens <= 4 * s.target_steps
    # every target step emits the accepted drafts plus one token (the last step may be cut by max_tokens)
    assert s.num_output_tokens <= s.total_accepted_draft_tokens + s.target_steps
    assert s.acceptance_rate == pytest.approx(s.total_accepted_draft_tokens / s.total_draft_tokens)
    self_dec = SpeculativeDecoder(target, target, max_draft_len=4)
    full = self_dec.generate([prompts[1]], 41)[0].stats
    assert full.acceptance_rate == 1.0 and full.target_steps == 9  # 41 tokens = 8 steps of 5 + 1


def test_streaming_chunks_concatenate_to_the_result(models, prompts, reference):
    target, _, noisy, _ = models
    dec = SpeculativeDecoder(target, noisy, max_draft_len=4)
    chunks, final = [], None
    for event in dec.stream(prompts[2], 48):
        if isinstance(event, list):
            chunks.append(event)
        else:
            final = event
    assert len(chunks) > 1 and sum(chunks, []) == final.token_ids == reference[2]


def test_kv_cache_is_reused_not_recomputed(models, prompts):
    """Target forward passes see only new tokens: the first pass the prompt and K drafts, then at most K + 1."""
    target, _, noisy, _ = models
    seen = []
    hook = target.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    try:
        r = SpeculativeDecoder(target, noisy, max_draft_len=4).generate([prompts[1]], 30)[0]
    finally:
        hook.remove()
    assert seen[0] == len(prompts[1]) + 4
    assert all(n <= 5 for n in seen[1:])
    assert len(seen) == r.stats.target_steps


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be > 0"),
        ({"max_tokens": 5, "num_draft_tokens": 17}, r"num_draft_tokens must be in 0\.\.16, got 17"),
        ({"max_tokens": 5, "prompts": [[]]}, "prompt 0 is empty"),
        ({"max_tokens": 5, "prompts": [[1] * 4095]}, "exceeds the model's context of 4096"),
        ({"max_tokens": 5, "prompts": [[10**6]]}, "outside the vocabulary"),
    ],
)
def test_bad_input_is_a_clear_error(models, prompts, kwargs, message):
    dec = SpeculativeDecoder(models[0], models[1])
    kwargs = {"prompts": prompts[:1], **kwargs}
    with pytest.raises(GenerationError, match=message):
        dec.generate(kwargs.pop("prompts"), **kwargs)


def test_draft_with_other_vocabulary_is_refused(models, tmp_path, tiny_tokenizer):
    from tests.tiny import make_llama

    other = tmp_path / "other"
    make_llama(other, tiny_tokenizer, layers=1)
    model = load_model(other)
    model.resize_token_embeddings(model.config.vocab_size + 8)
    with pytest.raises(IncompatibleModelsError, match="vocabulary"):
        SpeculativeDecoder(models[0], model)
    with pytest.raises(GenerationError, match=r"max_draft_len 0 must be in 1\.\.16"):
        SpeculativeDecoder(models[0], models[1], max_draft_len=0)


@pytest.mark.parametrize("which", ["noisy", "random"])
def test_verification_applies_the_head_only_where_logits_are_used(models, prompts, reference, which):
    """The head runs at most twice per step: over every sequence's first row (each is decided), then over all the
    later rows of the sequences whose first proposal was accepted (two reads of the vocabulary matrix at most,
    instead of one per position, and no rows after a first rejection). Alone, a step whose first proposal is
    rejected computes one row. The output equals the full-logits path's."""
    target, draft, noisy, _ = models
    dec = SpeculativeDecoder(target, noisy if which == "noisy" else draft, max_draft_len=4)
    assert dec.head is target.lm_head
    rows_seen = []
    head = dec.head
    dec.head = lambda hidden: (rows_seen.append(hidden.shape[0]), head(hidden))[1]
    alone = [dec.generate([p], 48)[0] for p in prompts]
    assert [r.token_ids for r in alone] == reference
    steps = sum(r.stats.target_steps for r in alone)
    assert steps <= len(rows_seen) <= 2 * steps
    assert all(1 <= n <= 4 for n in rows_seen)  # a first row, or a step's later rows (K = 4 at most)
    assert sum(rows_seen) < 5 * steps  # fewer than K + 1 per step
    rows_seen.clear()
    batch = dec.generate(prompts, 48)
    assert [r.token_ids for r in batch] == reference
    print("rows per head call in the batch:", rows_seen)
    assert max(rows_seen) > 1  # one call over several sequences' rows
    # at most two calls a step (every sequence's first row; the later rows of those whose first was accepted) ...
    assert len(rows_seen) <= 2 * max(r.stats.target_steps for r in batch) + 1
    # ... and not every row: a rejected position's later rows are not computed
    every = sum(5 * r.stats.target_steps for r in batch)
    assert sum(rows_seen) < every, (sum(rows_seen), every)
    dec.head = None  # full logits for every position, as for model classes without a plain head
    assert [r.token_ids for r in dec.generate(prompts, 48)] == reference


def test_decide_gives_each_candidate_what_it_gets_alone_when_the_head_runs_once_over_every_row():
    """With two or more drafts the head runs once over every row and plain greedy rows take one argmax over all of
    them; rows with bad words, logprobs or logits to return take the per-row route. Mixed in one call, every
    candidate's decision equals the one it gets decided alone."""
    from trtspec.speculative.acceptance import Candidate, decide
    from trtspec.speculative.rules import SamplingParams

    torch.manual_seed(0)
    vocab = 50
    greedy = SamplingParams()
    states = [torch.randn(k + 1, vocab) for k in (3, 2, 4, 0, 3)]
    best = [s.argmax(-1).tolist() for s in states]
    cands = [
        Candidate(best[0][:2] + [(best[0][2] + 1) % vocab], greedy),  # two accepted, then a correction
        Candidate(best[1][:2], greedy, bad_words=[[best[1][0]]]),  # its first choice banned: rejected at once
        Candidate(best[2][:4], greedy, logprobs=2),  # all accepted, the bonus token, with logprobs
        Candidate([], greedy),  # no draft: a plain step
        Candidate(best[4][:3], greedy, keep_logits=True),
    ]
    together = decide(cands, states, lambda x: x)
    alone = [decide([c], [s], lambda x: x)[0] for c, s in zip(cands, states)]
    assert [(d.accepted, d.token) for d in together] == [(d.accepted, d.token) for d in alone]
    assert [(d.accepted, d.token) for d in together][:1] == [(2, best[0][2])]
    assert together[1].accepted == 0 and together[1].token != best[1][0]
    assert together[2].accepted == 4 and together[2].logprobs == alone[2].logprobs
    assert all(torch.equal(a, b) for a, b in zip(together[4].logits, alone[4].logits))


def test_decide_computes_every_row_in_one_multiply_where_a_few_rows_cost_one():
    """``flat_rows`` (trtspec's float32 CPU kernel: up to 8 rows cost about one) makes a step with that many rows in
    all take one head multiply over every row, where it would otherwise take two (the first rows, then the later rows
    of the sequences whose first proposal was accepted); the decisions are the same, and a step with more rows keeps
    the two multiplies."""
    from trtspec.speculative.acceptance import Candidate, decide
    from trtspec.speculative.rules import SamplingParams

    torch.manual_seed(1)
    vocab = 40
    states = [torch.randn(5, vocab), torch.randn(3, vocab)]
    best = [s.argmax(-1).tolist() for s in states]
    cands = [
        Candidate(best[0][:3] + [(best[0][3] + 1) % vocab], SamplingParams()),
        Candidate(best[1][:2], SamplingParams()),
    ]
    for flat, calls_expected in ((8, [8]), (7, [2, 6]), (0, [2, 6])):
        calls: list[int] = []

        def head(x: torch.Tensor, calls: list[int] = calls) -> torch.Tensor:
            calls.append(x.shape[0])
            return x

        got = decide(cands, states, head, flat_rows=flat)
        assert calls == calls_expected, flat
        assert [(d.accepted, d.token) for d in got] == [(3, best[0][3]), (2, best[1][2])]
