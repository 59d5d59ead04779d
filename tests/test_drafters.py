"""N-gram and hybrid drafting: the pool, prompt lookup, the hybrid rule, and losslessness through the decoder's
in-flight engine (trtspec.speculative.drafters, built by trtspec.runtimes.inflight.drafter.engine_drafter)."""

from __future__ import annotations

import numpy as np
import pytest

from trtspec.speculative.drafters import DrafterKind, Proposal
from trtspec.speculative.drafters.hybrid import HybridRule
from trtspec.speculative.drafters.ngram import NgramDrafter, NgramPool, PromptIndex, prompt_lookup, read_pool_meta


def test_prompt_lookup_takes_the_longest_suffix_and_its_latest_occurrence():
    ctx = [5, 6, 7, 1, 2, 9, 5, 6, 8, 3, 5, 6]
    # suffix [5, 6] occurred at 0 and 6: the latest (6) is followed by 8, 3
    assert prompt_lookup(ctx, 2) == Proposal([8, 3], 2, "prompt")
    # a longer match wins over a more recent shorter one
    ctx = [1, 2, 3, 4, 9, 3, 7, 1, 2, 3]
    assert prompt_lookup(ctx, 3) == Proposal([4, 9, 3], 3, "prompt")
    assert prompt_lookup([1, 2, 3], 4).tokens == []
    assert prompt_lookup(ctx, 3, min_match=4).tokens == []


def _lookup_by_windows(context, k, max_match, min_match):
    """Prompt lookup by its definition: every window of each length, longest first, the last occurrence."""
    for n in range(min(max_match, len(context) - 1), min_match - 1, -1):
        hits = [s for s in range(len(context) - n) if context[s : s + n] == context[len(context) - n :]]
        if hits:
            return Proposal(context[hits[-1] + n : hits[-1] + n + k], n, "prompt")
    return Proposal()


def test_prompt_lookup_equals_its_definition_on_random_contexts():
    """The candidate search (occurrences of the last token, extended backwards) must find what a scan of every
    window finds: the same suffix length, the same (most recent) occurrence, the same continuation."""
    rng = np.random.default_rng(0)
    for _ in range(3000):
        vocab = int(rng.choice([2, 3, 6, 40]))
        ctx = [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(0, 50)))]
        k, max_match, min_match = int(rng.integers(0, 7)), int(rng.integers(1, 7)), int(rng.integers(1, 4))
        want = _lookup_by_windows(ctx, k, max_match, min_match) if len(ctx) >= 2 and k > 0 else Proposal()
        assert prompt_lookup(ctx, k, max_match, min_match) == want, (ctx, k, max_match, min_match)


def test_the_incremental_prompt_index_answers_as_prompt_lookup_as_its_sequence_grows():
    """The engine's per-job index must propose what prompt lookup over the whole context proposes, step after step
    as tokens are committed (one to five at a time), and start over on a context that is shorter or differs at the
    last position it indexed (its guard: an engine job's history only grows)."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        vocab = int(rng.choice([2, 3, 6, 40]))
        max_match, min_match = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        index = PromptIndex(max_match)
        ctx: list[int] = []
        for _step in range(int(rng.integers(1, 30))):
            ctx += [int(t) for t in rng.integers(0, vocab, size=int(rng.integers(1, 6)))]
            k = int(rng.integers(0, 6))
            assert index.lookup(ctx, k, min_match) == prompt_lookup(ctx, k, max_match, min_match), ctx
        # not the indexed sequence grown: shorter, or another token at the last position indexed
        shorter = ctx[: int(rng.integers(0, len(ctx)))]
        changed = ctx[:-2] + [vocab] + ctx[-1:] + [int(t) for t in rng.integers(0, vocab, size=3)]
        for other in (shorter, changed):
            assert index.lookup(other, 4, min_match) == prompt_lookup(other, 4, max_match, min_match), (ctx, other)


def test_the_bls_drafters_keep_a_prompt_index_per_request_and_plan_as_without_it():
    """The BLS orchestrator's n-gram, hybrid and adaptive drafters keep a request's prompt-lookup index in its state;
    their plans step by step are those made without one."""
    from trtspec.speculative.drafters.adaptive import AdaptiveLocalDrafter

    pool = NgramPool.from_sequences([[1, 2, 3, 4, 5, 6], [2, 3, 7]], vocab_size=10, max_match=3)
    rng = np.random.default_rng(2)
    for drafter in (NgramDrafter(pool), HybridRule(NgramDrafter(pool), min_match=1)):
        state = drafter.new_state()
        assert isinstance(state, PromptIndex)
        seq: list[int] = []
        for _ in range(60):
            seq += [int(t) for t in rng.integers(0, 8, size=int(rng.integers(1, 4)))]
            assert drafter.plan(state, seq, 4) == drafter.plan(None, seq, 4), seq
    assert isinstance(AdaptiveLocalDrafter(NgramDrafter(pool), has_model=False).new_state().index, PromptIndex)


def test_the_pool_s_lookup_hash_is_its_tables_hash():
    """Lookups hash in Python integers, the tables in numpy's uint64 arithmetic: the values must agree (mod 2**64),
    or the pool would find nothing."""
    from trtspec.speculative.drafters.ngram import _hash, _hash_windows

    tokens = np.array([0, 49151, 7, 123, 65535, 3, 3, 3], dtype=np.int32)
    for n in range(1, 5):
        windows = _hash_windows(tokens, n)
        assert [_hash(tokens[i : i + n].tolist()) for i in range(len(tokens) - n + 1)] == windows.tolist()


def test_pool_predicts_the_most_frequent_label_and_round_trips(tmp_path):
    # "a b" is followed by c twice and d once; labels (the target's greedy choices) override the sampled tokens
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6, 4]]
    pool = NgramPool.from_sequences(seqs, vocab_size=10, max_match=3, meta={"source": "test"})
    assert pool.next_token([9, 1, 2]) == (3, 2)
    assert pool.chain([1, 2], 3) == Proposal([3, 4], 2, "pool")  # after 2,3: 4 and 5 tie -> lower id; then no 3,4
    labels = [[7, 7, 7, -1], [7, 7, 7, -1], [7, 7, 7, -1]]
    labelled = NgramPool.from_sequences(seqs, labels, vocab_size=10, max_match=3)
    assert labelled.next_token([1, 2]) == (7, 2)
    path = labelled.save(tmp_path / "ngram_pool.npz")
    again = NgramPool.load(path)
    assert again.next_token([1, 2]) == (7, 2) and again.n_tokens == 12
    meta = read_pool_meta(path)
    assert meta["vocab_size"] == 10 and meta["tokens"] == 12
    with pytest.raises(ValueError, match="not an n-gram pool"):
        np.savez(tmp_path / "other.npz", x=np.zeros(3))
        NgramPool.load(tmp_path / "other.npz")


def test_drafter_prefers_the_longer_match_and_extends_short_lookups_from_the_pool():
    pool = NgramPool.from_sequences([[10, 11, 12, 13, 14, 15]], vocab_size=20, max_match=4)
    drafter = NgramDrafter(pool)
    # context ends with 11 12 13 (pool match 3) while prompt lookup only matches "13" (1 token)
    assert drafter.propose([13, 2, 11, 12, 13], 2) == Proposal([14, 15], 3, "pool")
    # prompt lookup's continuation runs out after one token: the pool extends it
    p = drafter.propose([12, 13, 14, 9, 12, 13, 14], 3)
    assert p.source == "prompt" and p.tokens[:1] == [9]


def test_hybrid_rule_uses_ngrams_on_a_two_token_match_else_the_model():
    pool = NgramPool.from_sequences([[1, 2, 3, 4, 5]], vocab_size=8, max_match=3)
    rule = HybridRule(NgramDrafter(pool, use_prompt=False), min_match=2, model_k=3)
    hit = rule.choose([0, 1, 2], 4)
    assert hit.kind is DrafterKind.NGRAM and hit.proposal.tokens == [3, 4, 5]
    miss = rule.choose([0, 7, 2], 4)  # only "2" matches: one token
    assert miss.kind is DrafterKind.MODEL and miss.k == 3
    assert rule.choose([0, 7, 2], 2).k == 2


@pytest.fixture(scope="module")
def tiny_models(tiny_pair):
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer

    return load_model(tiny_pair[0]), load_model(tiny_pair[1]), load_tokenizer(tiny_pair[0])


PROMPTS = [
    "The quick brown",
    "def add(a, b):\n    return a",
    "Q: What is the capital of France? A:",
    "Speculative decoding lets",
    "the lazy dog",
    "Zürich café",
]


@pytest.fixture(scope="module")
def references(tiny_models):
    """Target-only greedy answers, and a pool of the target's answers to half of the prompts (so that some
    proposals are accepted and some rejected)."""
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder

    target, _, tok = tiny_models
    prompts = [tok.encode(p) for p in PROMPTS]
    base = SpeculativeDecoder(target, None)
    reference = [base.generate([p], 40)[0].token_ids for p in prompts]
    pool = NgramPool.from_sequences(
        [p + r for p, r in zip(prompts[::2], reference[::2])], vocab_size=target.config.vocab_size
    )
    return prompts, reference, pool


def _counts(results):
    return (sum(r.stats.total_draft_tokens for r in results), sum(r.stats.total_accepted_draft_tokens for r in results))


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("kind", ["ngram", "prompt_lookup", "hybrid", "adaptive"])
def test_ngram_hybrid_and_adaptive_are_lossless_through_the_decoder(tiny_models, references, kind, k):
    """The decoder's in-flight engine drafts with the n-gram drafter (no draft model), the hybrid or the adaptive
    drafter: greedy output equals target-only, one request at a time and all in one batch, and proposals are
    accepted and rejected."""
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder

    target, draft, _ = tiny_models
    prompts, reference, pool = references
    dec = SpeculativeDecoder(
        target,
        draft if kind in ("hybrid", "adaptive") else None,
        max_draft_len=k,
        drafter="ngram" if kind == "prompt_lookup" else kind,
        ngram_pool=None if kind == "prompt_lookup" else pool,
    )
    single = [dec.generate([p], 40)[0] for p in prompts]
    assert [r.token_ids for r in single] == reference
    drafted, accepted = _counts(single)
    assert drafted > accepted > 0, (drafted, accepted)
    batch = dec.generate(prompts, 40)
    assert [r.token_ids for r in batch] == reference
    assert all(
        r.stats.acceptance_rate
        == (r.stats.total_accepted_draft_tokens / r.stats.total_draft_tokens if r.stats.total_draft_tokens else 0.0)
        for r in batch
    )
    assert [r.token_ids for r in dec.generate(prompts[:2], 40, use_draft=False)] == reference[:2]


def test_hybrid_uses_both_sources_and_keeps_the_draft_cache_in_step(tiny_models, references):
    """Hybrid steps alternate between n-grams and the draft model (whose cache catches up on the tokens of n-gram
    steps); with sequences in flight together the output is still the target's."""
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder

    target, draft, _ = tiny_models
    prompts, reference, pool = references
    dec = SpeculativeDecoder(target, draft, max_draft_len=4, drafter="hybrid", ngram_pool=pool)
    results = dec.generate(prompts, 40)
    assert [r.token_ids for r in results] == reference
    hybrid = dec._engines[True].drafter
    assert hybrid.ngram_steps > 0 and hybrid.model_steps > 0, (hybrid.ngram_steps, hybrid.model_steps)


def test_every_registered_drafter_builds_an_engine_drafter_with_the_engine_interface(tiny_models, references):
    from trtspec.errors import GenerationError
    from trtspec.runtimes.inflight.drafter import ModelDrafter, engine_drafter
    from trtspec.speculative.drafters.adaptive import AdaptiveEngineDrafter
    from trtspec.speculative.drafters.hybrid import HybridEngineDrafter
    from trtspec.speculative.drafters.ngram import NgramEngineDrafter
    from trtspec.speculative.drafters.registry import DRAFTERS

    target, draft, _ = tiny_models
    _, _, pool = references
    vocab = target.config.vocab_size
    kinds = {
        "model": ModelDrafter,
        "ngram": NgramEngineDrafter,
        "hybrid": HybridEngineDrafter,
        "adaptive": AdaptiveEngineDrafter,
    }
    assert set(kinds) == {k.value for k in DRAFTERS}
    for kind, cls in kinds.items():
        d = engine_drafter(kind, draft_model=draft, pool=pool, vocab=vocab, slots=2, capacity=128)
        assert isinstance(d, cls)
        for name in ("admit", "release", "propose", "commit", "observe_pass"):
            assert callable(getattr(d, name))
        assert d.free > 0
    for kind in ("model", "hybrid"):
        with pytest.raises(GenerationError, match="needs a draft model"):
            engine_drafter(kind, pool=pool, vocab=vocab, slots=2, capacity=128)
    # the adaptive drafter without a draft model drafts with n-grams or not at all
    assert engine_drafter("adaptive", pool=pool, vocab=vocab, slots=2, capacity=128).model is None
    # a pool token the target cannot take ends the proposal there
    wide = NgramPool.from_sequences([[1, 2, vocab + 5, 3]], vocab_size=vocab + 10)
    from trtspec.runtimes.inflight.jobs import Job

    ng = engine_drafter("ngram", pool=wide, vocab=vocab, slots=1, capacity=64)
    job = Job(tokens=[7, 1, 2], max_new=4, on_tokens=lambda *_: None, on_error=lambda e: None)
    ng.admit(job)
    assert job.draft_state is not None
    assert ng.propose([job], [3])[0].tokens == []  # the pool continues 1 2 with an out-of-vocabulary token
