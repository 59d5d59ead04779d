"""Penalties and min_tokens (issue 21): TensorRT-LLM's semantics (tests/upstream/penalty_kernel.json), applied by the
one acceptance routine to the target's distribution, so that speculative output stays exactly the target's own.

References are independent of trtspec: transformers' own ``generate`` (its repetition penalty and ``min_new_tokens``
are the same rules), and a greedy loop over full forward passes with the penalty written here from the recorded
kernel. The sampled case is in tests/test_sampling_distribution.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.upstream import facts
from trtspec.errors import GenerationError
from trtspec.runtimes.inflight.contract import RowRequest
from trtspec.runtimes.torch.decoder import SpeculativeDecoder
from trtspec.runtimes.torch.loading import load_model, load_tokenizer
from trtspec.speculative.rules import SamplingParams
from trtspec.speculative.sampling import apply_penalties, logits_to_probs, token_counts
from trtspec.triton_repo.orchestrator import Deployment, plan_request

KERNEL = facts.load("penalty_kernel")
PROMPTS = ["The quick brown", "def add(a, b):\n    return a", "Q: What is the capital of France? A:", "Z"]
N = 32


def _kernel_penalties(logits: torch.Tensor, counts: torch.Tensor, rep: float, pres: float, freq: float):
    """The recorded kernel's rules, element by element: for a token seen at least once, repetition, then presence,
    then frequency (the order in KERNEL["order"])."""
    out = logits.float().clone()
    for tok in torch.nonzero(counts > 0).flatten().tolist():
        x = float(out[tok])
        x = x * rep if x < 0 else x / rep
        x -= pres
        x -= freq * int(counts[tok])
        out[tok] = x
    return out


def test_penalties_follow_tensorrt_llms_kernel():
    assert KERNEL["order"] == ["bias", "temperature", "repetition", "presence", "frequency"]
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(50, generator=gen) * 3
    counts = token_counts([1, 1, 4, 7, 7, 7, 49, 60], 50)  # 60: outside the vocabulary, not counted
    assert counts.tolist().count(0) == 46 and int(counts[7]) == 3
    p = SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25)
    want = _kernel_penalties(logits, counts, 1.3, 0.5, 0.25)
    assert torch.allclose(apply_penalties(logits, p, counts), want)
    assert not torch.allclose(want, logits)
    # temperature first, then the penalties (the kernel's order), then top-k / top-p
    t = SamplingParams(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25)
    assert torch.allclose(
        logits_to_probs(logits, t, counts), torch.softmax(_kernel_penalties(logits / 0.7, counts, 1.3, 0.5, 0.25), -1)
    )


@pytest.fixture(scope="module")
def models(tiny_pair):
    target = load_model(tiny_pair[0])
    noisy = load_model(tiny_pair[0])  # a draft that agrees with the target part of the time
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.0015)
    tok = load_tokenizer(tiny_pair[0])
    return target, noisy, [tok.encode(p) for p in PROMPTS]


def _decoders(target, noisy):
    """Target only, the draft model at K 4, and n-grams (prompt lookup) at K 4."""
    return {
        "target only": SpeculativeDecoder(target, None),
        "model K4": SpeculativeDecoder(target, noisy, max_draft_len=4),
        "ngram K4": SpeculativeDecoder(target, None, max_draft_len=4, drafter="ngram"),
    }


def _plain(target, prompts):
    return [
        target.generate(torch.tensor([p]), max_new_tokens=N, do_sample=False, eos_token_id=None, pad_token_id=0)[
            0, len(p) :
        ].tolist()
        for p in prompts
    ]


@torch.no_grad()
def test_repetition_penalty_equals_transformers_with_and_without_a_draft(models):
    target, noisy, prompts = models
    ref = [
        target.generate(
            torch.tensor([p]),
            max_new_tokens=N,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            repetition_penalty=1.3,
        )[0, len(p) :].tolist()
        for p in prompts
    ]
    assert ref != _plain(target, prompts)  # the penalty changes the text: the comparison can fail
    params = SamplingParams(repetition_penalty=1.3)
    for name, dec in _decoders(target, noisy).items():
        assert [r.token_ids for r in dec.generate(prompts, N, params)] == ref, name  # a batch of 4
        assert dec.generate([prompts[1]], N, params)[0].token_ids == ref[1], name  # alone
    drafted = SpeculativeDecoder(target, noisy, max_draft_len=4).generate(prompts, N, params)
    assert sum(r.stats.total_accepted_draft_tokens for r in drafted) > 0  # drafts were verified under the penalty


@torch.no_grad()
def test_presence_and_frequency_penalties_equal_a_full_recompute_loop(models):
    target, noisy, prompts = models
    pres, freq = 0.8, 0.4

    def loop(p):
        seq = list(p)
        for _ in range(N):
            logits = target(torch.tensor([seq])).logits[0, -1]
            counts = torch.bincount(torch.tensor(seq), minlength=logits.shape[-1])
            seq.append(int(_kernel_penalties(logits, counts, 1.0, pres, freq).argmax()))
        return seq[len(p) :]

    ref = [loop(p) for p in prompts]
    assert ref != _plain(target, prompts)
    params = SamplingParams(presence_penalty=pres, frequency_penalty=freq)
    for name, dec in _decoders(target, noisy).items():
        assert [r.token_ids for r in dec.generate(prompts, N, params)] == ref, name


@torch.no_grad()
def test_min_tokens_equals_transformers_min_new_tokens_with_and_without_a_draft(models):
    target, noisy, prompts = models
    # a token greedy emits first at position >= 2: the end token, so that min_tokens decides where the text ends
    p, plain, end = next(
        (p, plain, t)
        for p, plain in zip(prompts, _plain(target, prompts))
        for i, t in enumerate(plain)
        if i >= 2 and t not in plain[:i]
    )
    stop_at = plain.index(end)
    for min_tokens in (0, stop_at + 6):
        ref = target.generate(
            torch.tensor([p]),
            max_new_tokens=N,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=end,
            min_new_tokens=min_tokens,
        )[0, len(p) :].tolist()
        assert (len(ref) == stop_at + 1) == (min_tokens == 0), (ref, stop_at)
        params = SamplingParams(min_tokens=min_tokens)
        for dec in (
            SpeculativeDecoder(target, None, eos_ids=[end]),
            SpeculativeDecoder(target, noisy, max_draft_len=4, eos_ids=[end]),
        ):
            assert dec.generate([p], N, params)[0].token_ids == ref, min_tokens


def test_the_bls_orchestration_over_tensorrt_llm_engines_refuses_penalties_by_name():
    """TensorRT-LLM's kernel counts the tokens before a step for every draft position in it (the recorded
    ``tokens_per_step``), so verified drafts would not be its own penalized output."""
    trtllm = Deployment(exact_penalties=False)
    for field, value in (("repetition_penalty", 1.2), ("presence_penalty", 0.5), ("min_tokens", 3)):
        row = RowRequest(tokens=[1, 2, 3], max_new=8, sampling=SamplingParams(**{field: value}))
        with pytest.raises(GenerationError, match=f"{field} is not supported by the BLS orchestration"):
            plan_request(row, trtllm)
        assert plan_request(row, Deployment()).k == 4  # torch engines apply them per position: served
    assert plan_request(RowRequest(tokens=[1, 2, 3], max_new=8), trtllm).k == 4


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("repetition_penalty", 0.0, "repetition_penalty must be > 0, got 0.0"),
        ("repetition_penalty", float("inf"), "repetition_penalty must be > 0, got inf"),
        ("presence_penalty", 2.5, "presence_penalty must be in -2..2, got 2.5"),
        ("frequency_penalty", -3.0, "frequency_penalty must be in -2..2, got -3.0"),
        ("min_tokens", -1, "min_tokens must be >= 0, got -1"),
        ("min_tokens", 2**31, "min_tokens must be at most 2147483647"),
        ("min_tokens", 1.5, "min_tokens must be an integer"),
    ],
)
def test_bad_penalties_are_refused_by_the_one_rule(field, value, message):
    with pytest.raises(GenerationError, match=message.replace("+", r"\+")):
        SamplingParams(**{field: value})
