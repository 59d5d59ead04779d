"""The draft-target orchestrator (the tensorrt_llm_bls loop) over in-process engines: lossless, routed, streamed,
concurrent; statistics."""

from __future__ import annotations

import asyncio

import pytest

from trtspec.engines.inflight.engine import InflightEngine
from trtspec.engines.inflight.local import LocalEngines
from trtspec.engines.torch_runtime.decoder import SpeculativeDecoder
from trtspec.engines.torch_runtime.loading import load_model
from trtspec.triton_repo.orchestrator import Deployment, GenRequest, GenStats, StepParams, generate

EOS = 2
PROMPTS = [list(range(10, 10 + 4 * i + 3)) for i in range(6)]


@pytest.fixture(scope="module")
def setup(tiny_pair, tmp_path_factory):
    from serving_helpers import make_noisy_draft

    noisy = make_noisy_draft(tiny_pair[0], tmp_path_factory.mktemp("noisy") / "draft")
    engines = {"tensorrt_llm": InflightEngine(load_model(tiny_pair[0])).start(),
               "tensorrt_llm_draft": InflightEngine(load_model(noisy)).start(),
               "random_draft": InflightEngine(load_model(tiny_pair[1])).start()}
    decoder = SpeculativeDecoder(load_model(tiny_pair[0]), None, eos_ids=[EOS], pad_id=3)
    yield LocalEngines(engines), decoder
    for e in engines.values():
        e.stop()


def target_only(decoder, prompt, n):
    return [t for t in decoder.generate([prompt], n, use_draft=False)[0].token_ids if t != EOS]


async def _collect(req, engines, deployment):
    stats, out, chunks = GenStats(), [], 0
    async for tokens in generate(req, engines, deployment, stats):
        out += tokens
        chunks += 1
    return out, stats, chunks


def run(req, engines, deployment):
    return asyncio.run(_collect(req, engines, deployment))


@pytest.mark.parametrize("draft", ["tensorrt_llm_draft", "random_draft"])
def test_greedy_output_equals_target_only_for_concurrent_requests(setup, draft):
    engines, decoder = setup
    deployment = Deployment(draft_model=draft, max_draft_len=4)

    async def all_prompts():
        return await asyncio.gather(*[_collect(GenRequest(p, 24, StepParams(end_id=EOS)), engines, deployment)
                                      for p in PROMPTS])

    results = asyncio.run(all_prompts())
    for p, (out, stats, _) in zip(PROMPTS, results):
        assert out == target_only(decoder, p, 24)
        assert stats.draft_tokens > 0 and 0 <= stats.accepted_tokens <= stats.draft_tokens
        assert stats.output_tokens == len(out)
    if draft == "tensorrt_llm_draft":  # the noisy copy of the target agrees often (about half the time)
        assert sum(s.accepted_tokens for _, s, _ in results) / sum(s.draft_tokens for _, s, _ in results) > 0.25


def test_short_requests_and_k0_are_routed_to_the_target_alone(setup):
    engines, decoder = setup
    deployment = Deployment(max_draft_len=4, route_threshold=10)
    for req in (GenRequest(PROMPTS[1], 9, StepParams(end_id=EOS)),
                GenRequest(PROMPTS[1], 20, StepParams(end_id=EOS), num_draft_tokens=0)):
        out, stats, _ = run(req, engines, deployment)
        assert stats.routed_to_target and stats.draft_tokens == 0 and stats.acceptance_rate == 0.0
        assert out == target_only(decoder, PROMPTS[1], req.max_tokens)
    out, stats, _ = run(GenRequest(PROMPTS[1], 10, StepParams(end_id=EOS)), engines, deployment)
    assert not stats.routed_to_target and stats.draft_tokens > 0


def test_streamed_routed_request_arrives_in_several_chunks(setup):
    engines, decoder = setup
    out, stats, chunks = run(GenRequest(PROMPTS[2], 6, StepParams(end_id=EOS), stream=True), engines,
                             Deployment(route_threshold=100))
    assert out == target_only(decoder, PROMPTS[2], 6) and chunks == len(out) > 1


def test_stop_words_end_generation_on_the_speculative_path(setup):
    engines, decoder = setup
    ref = target_only(decoder, PROMPTS[4], 24)
    stop = ref[6:8]
    first = next(j for j in range(2, len(ref) + 1) if ref[j - 2: j] == stop)
    out, _, _ = run(GenRequest(PROMPTS[4], 24, StepParams(end_id=EOS, stop_words=[stop])), engines, Deployment())
    assert out == ref[:first]


def test_sampled_requests_are_reproducible_with_a_seed(setup):
    engines, _ = setup
    params = StepParams(end_id=EOS, temperature=0.8, top_k=20, seed=123)
    a, sa, _ = run(GenRequest(PROMPTS[0], 16, params), engines, Deployment())
    b, sb, _ = run(GenRequest(PROMPTS[0], 16, params), engines, Deployment())
    assert a == b and len(a) == 16 and sa.draft_tokens == sb.draft_tokens
