"""On the real embedded example (SmolLM2-135M-Instruct): speculative greedy output equals target-only greedy output."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
    "Hi",
]


@pytest.fixture(scope="module")
def session(example_paths):
    from trtspec.runtimes.torch.session import TorchSession

    return TorchSession(example_paths.target, example_paths.draft, max_draft_len=4)


@pytest.fixture(scope="module")
def prompts(session):
    return [session.encode(q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(session, prompts):
    dec = session.decoder
    return [dec.generate([p], 48, use_draft=False)[0].token_ids for p in prompts]


def test_target_only_path_equals_transformers_generate(session, prompts, reference):
    import torch

    for p, ref in zip(prompts[:2], reference[:2]):
        out = session.target.generate(
            torch.tensor([p]), max_new_tokens=48, do_sample=False, eos_token_id=session.decoder.eos_ids, pad_token_id=0
        )
        assert out[0, len(p) :].tolist() == ref


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_equal_with_example_draft_batch1_and_batch4(session, prompts, reference, k):
    dec = session.decoder
    assert dec.generate([prompts[0]], 48, num_draft_tokens=k)[0].token_ids == reference[0]
    assert [r.token_ids for r in dec.generate(prompts, 48, num_draft_tokens=k)] == reference


def test_eos_inside_draft_window_with_self_draft(session, prompts, reference):
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder

    eos = session.decoder.eos_ids
    assert reference[0][-1] in eos and len(reference[0]) < 48  # the short answer ends with <|im_end|>
    dec = SpeculativeDecoder(session.target, session.target, max_draft_len=8, eos_ids=eos)
    results = dec.generate(prompts, 48)
    assert [r.token_ids for r in results] == reference
    assert results[0].finish_reason == "stop" and results[0].stats.acceptance_rate == 1.0


def test_answer_is_sensible(session):
    r = session.generate("What is the capital of France?", 24)
    assert "Paris" in r.text


def _target_logprobs(model, prompt, out):
    """The target's own log-softmax at each generated position, from one transformers forward over the text."""
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt) + list(out)])).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(out)], -1)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_logprobs_are_the_targets_own_with_and_without_a_draft(session, prompts, reference, drafter):
    """Each emitted token's log-probability and its top 5 alternatives are the target's log-softmax at that position
    (computed here with transformers), the same with the draft (K 4, in a batch) as without: speculation verifies
    with the target's distribution, never the draft's."""
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder

    dec = SpeculativeDecoder(
        session.target,
        session.draft if drafter == "model" else None,
        max_draft_len=4,
        eos_ids=session.decoder.eos_ids,
        drafter=drafter,
    )
    alone = dec.generate([prompts[0]], 48, use_draft=False, logprobs=5)[0]
    batch = dec.generate(prompts, 48, logprobs=5)
    assert alone.token_ids == reference[0] and [r.token_ids for r in batch] == reference
    assert sum(r.stats.total_accepted_draft_tokens for r in batch) > 0  # speculation ran and was accepted
    for prompt, result in [(prompts[0], alone), *zip(prompts, batch)]:
        ref = _target_logprobs(session.target, prompt, result.token_ids)
        assert result.logprobs is not None and len(result.logprobs) == len(result.token_ids)
        for j, lp in enumerate(result.logprobs):
            assert lp.token == result.token_ids[j]
            assert abs(lp.logprob - float(ref[j, lp.token])) < 2e-3
            assert [t for t, _ in lp.top] == ref[j].topk(5).indices.tolist()
            assert lp.top[0][0] == lp.token  # greedy: the emitted token is the most likely
    for a, b in zip(alone.logprobs or [], batch[0].logprobs or []):
        assert abs(a.logprob - b.logprob) < 1e-3


def test_sampled_logprobs_are_the_targets_and_stream_equals_whole(session, prompts):
    """Sampled (temperature 0.8, seeded) with the draft: each token's log-probability is the target's raw
    log-softmax at its position (not the temperature-scaled or the draft's); the stream yields the same values."""
    from trtspec.runtimes.torch.decoder import GenerationResult
    from trtspec.speculative.rules import SamplingParams

    sampling = SamplingParams.from_request(0.8, 0, 1.0, 7)
    dec = session.decoder
    whole = dec.generate([prompts[2]], 32, sampling, logprobs=2)[0]
    ref = _target_logprobs(session.target, prompts[2], whole.token_ids)
    assert whole.logprobs is not None
    assert max(abs(lp.logprob - float(ref[j, lp.token])) for j, lp in enumerate(whole.logprobs)) < 2e-3
    final = [x for x in dec.stream(prompts[2], 32, sampling, logprobs=2) if isinstance(x, GenerationResult)][0]
    assert final.token_ids == whole.token_ids
    assert [(lp.token, lp.top and lp.top[0][0]) for lp in final.logprobs or []] == [
        (lp.token, lp.top and lp.top[0][0]) for lp in whole.logprobs
    ]
