"""The embedded example's draft is the distilled one shipped with trtspec: small, lossless, better than truncation."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
]


def test_shipped_draft_is_small_and_is_what_the_example_uses(example_paths):
    from trtspec.example import shipped_draft

    packed = shipped_draft()
    assert packed is not None, "trtspec/data/draft is missing"
    assert sum(p.stat().st_size for p in packed.iterdir()) <= 25 * 2**20
    assert "distilled" in example_paths.draft.name


def test_distilled_draft_is_lossless_and_accepts_more_than_the_truncated_one(example_paths):
    from trtspec.example import DRAFT_LAYERS, TARGET_NAME, _atomic_build, _truncate
    from trtspec.paths import cache_dir
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder
    from trtspec.runtimes.torch.loading import load_model
    from trtspec.runtimes.torch.session import TorchSession

    session = TorchSession(example_paths.target, example_paths.draft, max_draft_len=4)
    # a standard LlamaForCausalLM on disk; trtspec's loader applies its frequent head
    assert type(session.draft).__name__ == "LlamaForCausalLM"
    assert type(session.draft.lm_head).__name__ == "FrequentHead"
    truncated = load_model(
        _atomic_build(
            cache_dir() / "models" / f"{TARGET_NAME}-first{DRAFT_LAYERS}", _truncate(example_paths.target, DRAFT_LAYERS)
        )
    )
    prompts = [session.encode(q) for q in QUESTIONS]
    eos = session.decoder.eos_ids
    reference = [r.token_ids for r in session.decoder.generate(prompts, 40, use_draft=False)]

    def run(draft):
        dec = SpeculativeDecoder(session.target, draft, max_draft_len=4, eos_ids=eos)
        results = [dec.generate([p], 40)[0] for p in prompts]
        assert [r.token_ids for r in results] == reference  # lossless
        accepted = sum(r.stats.total_accepted_draft_tokens for r in results)
        return accepted / sum(r.stats.total_draft_tokens for r in results)

    assert run(session.draft) > run(truncated) + 0.05
