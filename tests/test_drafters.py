"""N-gram and hybrid drafting: the pool, prompt lookup, the hybrid rule, and losslessness through the real decoder."""

from __future__ import annotations

import numpy as np
import pytest

from trtspec.engines.drafters import DrafterKind, Proposal
from trtspec.engines.drafters.hybrid import HybridRule
from trtspec.engines.drafters.ngram import NgramDrafter, NgramPool, prompt_lookup, read_pool_meta


def test_prompt_lookup_takes_the_longest_suffix_and_its_latest_occurrence():
    ctx = [5, 6, 7, 1, 2, 9, 5, 6, 8, 3, 5, 6]
    # suffix [5, 6] occurred at 0 and 6: the latest (6) is followed by 8, 3
    assert prompt_lookup(ctx, 2) == Proposal([8, 3], 2, "prompt")
    # a longer match wins over a more recent shorter one
    ctx = [1, 2, 3, 4, 9, 3, 7, 1, 2, 3]
    assert prompt_lookup(ctx, 3) == Proposal([4, 9, 3], 3, "prompt")
    assert prompt_lookup([1, 2, 3], 4).tokens == []
    assert prompt_lookup(ctx, 3, min_match=4).tokens == []


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
def tiny_target(tiny_pair):
    from trtspec.engines.torch_runtime.loading import load_model, load_tokenizer

    return load_model(tiny_pair[0]), load_tokenizer(tiny_pair[0])


PROMPTS = ["The quick brown", "def add(a, b):\n    return a", "Q: What is the capital of France? A:",
           "Speculative decoding lets", "the lazy dog", "Zürich café"]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_ngram_and_hybrid_proposals_are_lossless_through_the_decoder(tiny_target, k):
    """Proposals fed to today's SpeculativeDecoder as a draft's (tests/drafter_adapter.py) leave the greedy output
    equal to target-only; the pool comes from the target's answers to half of the prompts, so some proposals are
    accepted and some rejected."""
    from drafter_adapter import DrafterAsDraftModel

    from trtspec.engines.torch_runtime.decoder import SpeculativeDecoder

    target, tok = tiny_target
    prompts = [tok.encode(p) for p in PROMPTS]
    base = SpeculativeDecoder(target, None)
    reference = [base.generate([p], 40)[0].token_ids for p in prompts]
    pool = NgramPool.from_sequences([p + r for p, r in zip(prompts[::2], reference[::2])],
                                    vocab_size=target.config.vocab_size)
    for drafter in (NgramDrafter(pool), NgramDrafter(None)):
        accepted = drafted = 0
        for p, ref in zip(prompts, reference):
            adapter = DrafterAsDraftModel(drafter, target.config.vocab_size, k)
            dec = SpeculativeDecoder(target, adapter, max_draft_len=k)
            r = dec.generate([p], 40)[0]
            assert r.token_ids == ref
            stats = r.stats
            drafted += getattr(stats, "total_draft_tokens", getattr(stats, "draft_tokens", 0))
            accepted += getattr(stats, "total_accepted_draft_tokens", getattr(stats, "accepted_tokens", 0))
        assert drafted > accepted > 0, (drafted, accepted)
