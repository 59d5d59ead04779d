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
    assert dec.generate([prompts[0]], 48, draft_len=k)[0].token_ids == reference[0]
    assert [r.token_ids for r in dec.generate(prompts, 48, draft_len=k)] == reference


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
