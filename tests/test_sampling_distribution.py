"""Speculative sampling follows the target's distribution exactly (chi-square on a tiny-vocabulary model).

The exact joint distribution of the first three generated tokens is computed from the target's own probabilities
(after the same temperature / top-k / top-p transform); several thousand seeded speculative samples are compared with
it by a chi-square goodness-of-fit test at significance alpha = 0.001. The same test must reject a sampler whose
acceptance rule is broken (every draft token accepted), so the test has the power to see a wrong rule.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from trtspec.runtimes.torch.decoder import SpeculativeDecoder
from trtspec.speculative import acceptance as acceptance_mod
from trtspec.speculative.sampling import SamplingParams, logits_to_probs, token_counts

ALPHA = 1e-3
VOCAB = 6
N_TOKENS = 3
SAMPLES = 6000
PROMPT = [1, 4, 2]


def _tiny_vocab_model(seed: int, scale: float):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def pair():
    return _tiny_vocab_model(0, 30.0), _tiny_vocab_model(1, 30.0)


@torch.no_grad()
def _exact_joint(target, params: SamplingParams) -> dict[tuple[int, ...], float]:
    probs: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(VOCAB), repeat=N_TOKENS):
        ids = torch.tensor([PROMPT + list(seq)])
        logits = target(ids).logits[0]
        p = 1.0
        for j, tok in enumerate(seq):
            counts = token_counts(PROMPT + list(seq[:j]), VOCAB)  # penalties see the prompt and the tokens so far
            p *= float(logits_to_probs(logits[len(PROMPT) - 1 + j], params, counts)[tok])
        probs[seq] = p
    return probs


def _samples(target, draft, params: SamplingParams, k: int, lazy_head: bool = True) -> list[tuple[int, ...]]:
    dec = SpeculativeDecoder(target, draft, max_draft_len=k)
    assert dec.head is not None  # a LlamaForCausalLM: verification applies the head position by position
    if not lazy_head:
        dec.head = None  # what other model classes get: full logits for the K + 1 positions
    out = []
    for chunk in range(SAMPLES // 500):
        p = dataclasses.replace(params, seed=chunk * 1000)
        out += [tuple(r.token_ids) for r in dec.generate([PROMPT] * 500, N_TOKENS, p)]
    return out


def _chi_square_p(samples, exact) -> float:
    from scipy.stats import chisquare

    counts = {k: 0 for k in exact}
    for s in samples:
        counts[s] += 1
    # Pool cells with expected count < 5 into one, as the chi-square approximation needs.
    n = len(samples)
    obs, exp, pooled_o, pooled_e = [], [], 0, 0.0
    for key, p in exact.items():
        if p * n < 5:
            pooled_o += counts[key]
            pooled_e += p * n
        else:
            obs.append(counts[key])
            exp.append(p * n)
    if pooled_e > 0:
        obs.append(pooled_o)
        exp.append(pooled_e)
    total = sum(exp)
    exp = [e * n / total for e in exp]
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize(
    ("params", "k", "lazy_head"),
    [
        (SamplingParams(temperature=1.0), 2, True),
        (SamplingParams(temperature=0.8, top_k=4, top_p=0.9), 3, True),
        (SamplingParams(temperature=1.0), 2, False),
        # penalties shape the target's distribution at each position by the tokens before it (draft tokens included)
        (SamplingParams(temperature=1.0, repetition_penalty=2.0, presence_penalty=1.0, frequency_penalty=0.5), 3, True),
    ],
)
def test_speculative_sampling_matches_target_distribution(pair, params, k, lazy_head):
    target, draft = pair
    exact = _exact_joint(target, params)
    samples = _samples(target, draft, params, k, lazy_head)
    p_value = _chi_square_p(samples, exact)
    assert p_value > ALPHA, p_value
    # The draft really differs from the target, so a lossy rule would show.
    draft_exact = _exact_joint(draft, params)
    tv = 0.5 * sum(abs(exact[s] - draft_exact[s]) for s in exact)
    assert tv > 0.2, tv


@pytest.mark.parametrize("lazy_head", [True, False])
def test_the_chi_square_test_rejects_a_broken_acceptance_rule(pair, monkeypatch, lazy_head):
    target, draft = pair
    params = SamplingParams(temperature=1.0)

    # accept every draft token: the rule both paths (lazy head or full logits) apply
    monkeypatch.setattr(acceptance_mod, "accepts", lambda u, q, p: torch.ones_like(p, dtype=torch.bool))
    p_value = _chi_square_p(_samples(target, draft, params, 2, lazy_head), _exact_joint(target, params))
    assert p_value < ALPHA, p_value


def test_seeded_sampling_is_reproducible(pair):
    target, draft = pair
    dec = SpeculativeDecoder(target, draft, max_draft_len=3)
    a = dec.generate([PROMPT] * 4, 10, SamplingParams(temperature=1.0, seed=7))
    b = dec.generate([PROMPT] * 4, 10, SamplingParams(temperature=1.0, seed=7))
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert len({tuple(r.token_ids) for r in a}) > 1  # rows get different streams


@pytest.mark.parametrize("kind", ["ngram", "hybrid", "adaptive"])
def test_ngram_hybrid_and_adaptive_sampling_match_target_distribution(pair, kind):
    """n-gram proposals are point masses (q = 1 on the token): accepted with probability p(x), else resampled from p
    without x. A pool of random sequences over the tiny vocabulary always proposes, so most steps verify drafts.
    The adaptive drafter switches between the draft model, n-grams and no draft, and K, on what happened before
    (tests.adaptive_helpers.SwitchingPolicy): the distribution stays the target's."""
    from tests.adaptive_helpers import SwitchingPolicy
    from trtspec.speculative.drafters.ngram import NgramPool

    target, draft = pair
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(3)
    pool = NgramPool.from_sequences(
        [torch.randint(0, VOCAB, (40,), generator=gen).tolist() for _ in range(20)], vocab_size=VOCAB, max_match=2
    )
    policy = SwitchingPolicy()
    dec = SpeculativeDecoder(
        target, draft if kind != "ngram" else None, max_draft_len=3, drafter=kind, ngram_pool=pool, policy=policy
    )
    out, drafted, accepted = [], 0, 0
    for chunk in range(SAMPLES // 500):
        p = SamplingParams(params.temperature, seed=chunk * 1000)
        results = dec.generate([PROMPT] * 500, N_TOKENS, p)
        out += [tuple(r.token_ids) for r in results]
        drafted += sum(r.stats.total_draft_tokens for r in results)
        accepted += sum(r.stats.total_accepted_draft_tokens for r in results)
    assert drafted > accepted > 0, (drafted, accepted)
    if kind == "adaptive":
        assert all(policy.steps[s] > 0 for s in ("ngram", "model", "none")), policy.steps
    p_value = _chi_square_p(out, _exact_joint(target, params))
    assert p_value > ALPHA, p_value
