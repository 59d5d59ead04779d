"""The draft-target orchestrator (the tensorrt_llm_bls loop) over in-process engines: lossless, routed, streamed,
concurrent; statistics."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from trtspec.errors import GenerationError
from trtspec.runtimes.inflight.contract import RowRequest, engine_inputs, parse_request
from trtspec.runtimes.inflight.engine import InflightEngine
from trtspec.runtimes.inflight.local import LocalEngines
from trtspec.runtimes.torch.decoder import SpeculativeDecoder
from trtspec.runtimes.torch.loading import load_model
from trtspec.speculative.rules import SamplingParams, SpecStats
from trtspec.triton_repo.orchestrator import Deployment, generate

EOS = 2
DTYPES = {"INT32": np.int32, "FP32": np.float32}
PROMPTS = [list(range(10, 10 + 4 * i + 3)) for i in range(6)]


@pytest.fixture(scope="module")
def setup(tiny_pair, tmp_path_factory):
    from tests.serving_helpers import make_noisy_draft

    noisy = make_noisy_draft(tiny_pair[0], tmp_path_factory.mktemp("noisy") / "draft")
    engines = {
        "tensorrt_llm": InflightEngine(load_model(tiny_pair[0])).start(),
        "tensorrt_llm_draft": InflightEngine(load_model(noisy)).start(),
        "random_draft": InflightEngine(load_model(tiny_pair[1])).start(),
    }
    decoder = SpeculativeDecoder(load_model(tiny_pair[0]), None, eos_ids=[EOS], pad_id=3)
    yield LocalEngines(engines), decoder
    for e in engines.values():
        e.stop()


def target_only(decoder, prompt, n):
    return [t for t in decoder.generate([prompt], n, use_draft=False)[0].token_ids if t != EOS]


async def _collect(req, engines, deployment):
    stats, out, chunks = SpecStats(), [], 0
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
        return await asyncio.gather(*[_collect(RowRequest(p, 24, end_id=EOS), engines, deployment) for p in PROMPTS])

    results = asyncio.run(all_prompts())
    for p, (out, stats, _) in zip(PROMPTS, results):
        assert out == target_only(decoder, p, 24)
        assert stats.total_draft_tokens > 0 and 0 <= stats.total_accepted_draft_tokens <= stats.total_draft_tokens
        assert stats.num_output_tokens == len(out)
    if draft == "tensorrt_llm_draft":  # the noisy copy of the target agrees often (about half the time)
        accepted = sum(s.total_accepted_draft_tokens for _, s, _ in results)
        assert accepted / sum(s.total_draft_tokens for _, s, _ in results) > 0.25


def test_short_requests_and_k0_are_routed_to_the_target_alone(setup):
    engines, decoder = setup
    deployment = Deployment(max_draft_len=4, route_threshold=10)
    for req in (RowRequest(PROMPTS[1], 9, end_id=EOS), RowRequest(PROMPTS[1], 20, end_id=EOS, num_draft_tokens=0)):
        out, stats, _ = run(req, engines, deployment)
        assert stats.routed_to_target and stats.total_draft_tokens == 0 and stats.acceptance_rate == 0.0
        assert out == target_only(decoder, PROMPTS[1], req.max_new)
    out, stats, _ = run(RowRequest(PROMPTS[1], 10, end_id=EOS), engines, deployment)
    assert not stats.routed_to_target and stats.total_draft_tokens > 0


def test_streamed_routed_request_arrives_in_several_chunks(setup):
    engines, decoder = setup
    out, stats, chunks = run(
        RowRequest(PROMPTS[2], 6, end_id=EOS, stream=True), engines, Deployment(route_threshold=100)
    )
    assert out == target_only(decoder, PROMPTS[2], 6) and chunks == len(out) > 1


def test_stop_words_end_generation_on_the_speculative_path(setup):
    engines, decoder = setup
    ref = target_only(decoder, PROMPTS[4], 24)
    stop = ref[6:8]
    first = next(j for j in range(2, len(ref) + 1) if ref[j - 2 : j] == stop)
    out, _, _ = run(RowRequest(PROMPTS[4], 24, end_id=EOS, stop_words=[stop]), engines, Deployment())
    assert out == ref[:first]


def test_sampled_requests_are_reproducible_with_a_seed(setup):
    engines, _ = setup
    sampling = SamplingParams(temperature=0.8, top_k=20, seed=123)
    a, sa, _ = run(RowRequest(PROMPTS[0], 16, end_id=EOS, sampling=sampling), engines, Deployment())
    b, sb, _ = run(RowRequest(PROMPTS[0], 16, end_id=EOS, sampling=sampling), engines, Deployment())
    assert a == b and len(a) == 16 and sa.total_draft_tokens == sb.total_draft_tokens


def test_requests_the_engines_cannot_serve_are_refused_before_any_engine_call(setup):
    engines, _ = setup
    deployment = Deployment(max_draft_len=4, engine_max_draft_len=4, draft_logits_available=False)
    with pytest.raises(GenerationError, match=r"num_draft_tokens must be in 0\.\.4, got 8"):
        run(RowRequest(PROMPTS[0], 16, end_id=EOS, num_draft_tokens=8), engines, deployment)
    with pytest.raises(GenerationError, match="gather_generation_logits"):
        run(
            RowRequest(PROMPTS[0], 16, end_id=EOS, use_draft_logits=True, sampling=SamplingParams(temperature=1.0)),
            engines,
            deployment,
        )
    with pytest.raises(GenerationError, match="num_draft_tokens must be >= 0, got -1"):
        run(RowRequest(PROMPTS[0], 16, end_id=EOS, num_draft_tokens=-1), engines, deployment)
    # within the limit, fewer draft tokens than the default are served
    out, stats, _ = run(RowRequest(PROMPTS[0], 16, end_id=EOS, num_draft_tokens=2), engines, deployment)
    assert stats.total_draft_tokens <= 2 * stats.target_steps


def test_accepted_tokens_are_counted_by_prefix_match_of_the_target_output(setup):
    """A draft equal to the target is accepted whole: every proposal counts; a random draft mostly not."""
    engines, decoder = setup
    from trtspec.speculative.rules import accepted_prefix

    assert accepted_prefix([5, 6, 7], [5, 6, 9, 1]) == 2 and accepted_prefix([], [4]) == 0
    assert accepted_prefix([5, 6], [5, 6]) == 2  # the target stopped at end_id after two accepted tokens
    out, stats, _ = run(
        RowRequest(PROMPTS[3], 20, end_id=EOS), engines, Deployment(draft_model="tensorrt_llm", max_draft_len=4)
    )
    assert out == target_only(decoder, PROMPTS[3], 20)
    assert stats.total_accepted_draft_tokens == stats.total_draft_tokens > 0


class _CountingEngines:
    """The engines, counting the calls each model gets."""

    def __init__(self, engines):
        self.engines, self.calls = engines, {}

    def generate(self, model, row):
        self.calls[model] = self.calls.get(model, 0) + 1
        return self.engines.generate(model, row)


def _run_prompts(engines, drafter, answers) -> list[SpecStats]:
    """Every prompt through the orchestrator with ``drafter``, one at a time; each output must be the target's."""
    results = []
    for p in PROMPTS:

        async def one(p=p):
            stats, out = SpecStats(), []
            async for tokens in generate(
                RowRequest(p, 24, end_id=EOS), engines, Deployment(max_draft_len=4), stats, drafter=drafter
            ):
                out += tokens
            return out, stats

        out, stats = asyncio.run(one())
        assert out == answers[tuple(p)]
        results.append(stats)
    return results


@pytest.mark.parametrize("kind", ["ngram", "hybrid"])
def test_ngram_and_hybrid_proposals_reach_the_target_as_draft_tokens_losslessly(setup, kind):
    """The BLS orchestrator's n-gram drafter: a pool of the target's own answers makes its proposals accepted; ngram
    never calls the draft engine; greedy output is the target's either way."""
    from trtspec.speculative.drafters.hybrid import HybridRule
    from trtspec.speculative.drafters.ngram import NgramDrafter, NgramPool

    engines, decoder = setup
    answers = {tuple(p): target_only(decoder, p, 24) for p in PROMPTS}
    pool = NgramPool.from_sequences([p + answers[tuple(p)] for p in PROMPTS[:3]], vocab_size=512)
    drafter = NgramDrafter(pool) if kind == "ngram" else HybridRule(NgramDrafter(pool))
    counting = _CountingEngines(engines)
    results = _run_prompts(counting, drafter, answers)
    proposed = sum(stats.total_draft_tokens for stats in results)
    accepted = sum(stats.total_accepted_draft_tokens for stats in results)
    assert proposed >= accepted > 0.5 * proposed  # the pool holds the answers of half the prompts
    if kind == "ngram":
        assert "tensorrt_llm_draft" not in counting.calls
    else:
        assert counting.calls.get("tensorrt_llm_draft", 0) > 0  # prompts without a pooled answer use the model


def test_the_adaptive_drafter_switches_per_step_in_the_orchestrator_losslessly(setup):
    """The BLS orchestrator's adaptive drafter (registry-built, as the BLS model builds it) chooses per step between
    the n-grams, the draft engine and no draft, learning the costs from its own engine calls; greedy output is the
    target's, and with a pool of half the answers both sources and plain steps occur."""
    from trtspec.speculative.drafters.ngram import NgramPool
    from trtspec.speculative.drafters.registry import DrafterContext, local_drafter

    engines, decoder = setup
    answers = {tuple(p): target_only(decoder, p, 24) for p in PROMPTS}
    pool = NgramPool.from_sequences([p + answers[tuple(p)] for p in PROMPTS[:3]], vocab_size=512)
    drafter = local_drafter("adaptive", DrafterContext(pool=pool, has_draft_engine=True))
    counting = _CountingEngines(engines)
    no_draft = sum(stats.no_draft_steps for stats in _run_prompts(counting, drafter, answers))
    policy = drafter.policy
    assert policy.steps["ngram"] > 0, policy.snapshot()
    assert policy.target.seconds, "the target's call costs were learned"
    # the draft engine is called exactly when the policy chose the model
    assert (counting.calls.get("tensorrt_llm_draft", 0) > 0) == (policy.steps["model"] > 0)
    assert no_draft >= policy.steps["none"]  # plus the last step of each answer, which has no room for a draft
    assert drafter.in_flight == 0  # every request left the shared passes when it ended


def test_a_request_the_adaptive_drafter_does_not_speculate_for_steps_aside_in_plain_stretches(setup):
    """Where the adaptive drafter has nothing worth proposing, the BLS loop does not pay an engine call per token:
    the target generates 2, 4, 8 ... tokens in one streamed call, each token sent on as it comes. Output stays the
    target's; a stop word or end_id inside a stretch ends the answer where the target alone ends it; a seeded
    sampled request stays reproducible."""
    from trtspec.speculative.drafters.adaptive import AdaptiveLocalDrafter
    from trtspec.speculative.drafters.ngram import NgramDrafter

    engines, decoder = setup

    def drafter() -> AdaptiveLocalDrafter:  # no pool, no prompt lookup, no draft engine: nothing to propose
        return AdaptiveLocalDrafter(NgramDrafter(use_prompt=False), has_model=False)

    async def one(req, d, engines=engines):
        stats, out, chunks = SpecStats(), [], 0
        async for tokens in generate(req, engines, Deployment(max_draft_len=4), stats, drafter=d):
            out += tokens
            chunks += 1
        return out, stats, chunks

    d = drafter()
    for p in PROMPTS[:3]:
        counting = _CountingEngines(engines)
        out, stats, chunks = asyncio.run(one(RowRequest(p, 24, end_id=EOS, stream=True), d, counting))
        ref = target_only(decoder, p, 24)
        assert out == ref and chunks == len(out)  # streamed token by token
        if len(ref) == 24:
            assert counting.calls == {"tensorrt_llm": 4}  # 2 + 4 + 8 + 10 tokens, not 24 calls
        assert stats.target_steps == stats.no_draft_steps == len(out) and stats.total_draft_tokens == 0
    assert d.policy.steps["none"] == sum(len(target_only(decoder, p, 24)) for p in PROMPTS[:3])
    assert d.in_flight == 0

    ref = target_only(decoder, PROMPTS[4], 24)
    stop = ref[9:11]  # inside the third stretch (tokens 7..14)
    first = next(j for j in range(2, len(ref) + 1) if ref[j - 2 : j] == stop)
    out, _, _ = asyncio.run(one(RowRequest(PROMPTS[4], 24, end_id=EOS, stop_words=[stop]), drafter()))
    assert out == ref[:first]
    j = next(j for j in range(7, len(ref)) if ref[j] not in ref[:j])
    out, _, _ = asyncio.run(one(RowRequest(PROMPTS[4], 24, end_id=ref[j]), drafter()))
    assert out == ref[:j]

    sampling = SamplingParams(temperature=0.8, top_k=20, seed=321)
    a, _, _ = asyncio.run(one(RowRequest(PROMPTS[0], 24, end_id=EOS, sampling=sampling), drafter()))
    b, _, _ = asyncio.run(one(RowRequest(PROMPTS[0], 24, end_id=EOS, sampling=sampling), drafter()))
    assert a == b and len(a) == 24

    # With other requests in flight a stretch is batch_run tokens at once (each call costs a step of the batch):
    # three requests at a time, each request after the first joins a batch and makes one or two calls, not 4.
    async def together(reqs, d, engines):
        return await asyncio.gather(*(one(r, d, engines) for r in reqs))

    counting = _CountingEngines(engines)
    reqs = [RowRequest(p, 24, end_id=EOS, stream=True) for p in PROMPTS[:3]]
    results = asyncio.run(together(reqs, drafter(), counting))
    assert [out for out, _, _ in results] == [target_only(decoder, p, 24) for p in PROMPTS[:3]]
    full = sum(len(out) == 24 for out, _, _ in results[1:])
    assert counting.calls["tensorrt_llm"] <= 4 + 2 * (len(results) - 1) and full > 0
    assert counting.calls["tensorrt_llm"] < 4 * len(results)
    # a seeded sampled request ramps as if alone in a batch too: the same text as alone
    seeded = RowRequest(PROMPTS[0], 24, end_id=EOS, sampling=sampling)
    c = asyncio.run(together([RowRequest(PROMPTS[1], 24, end_id=EOS), seeded], drafter(), engines))[1][0]
    assert c == a


class _TensorEngines:
    """The BLS model's path to the engines: each engine request becomes the tensors tensorrt_llm_bls sends
    (``engine_inputs``), which the engine model parses back (``parse_request``); the tensors are kept."""

    def __init__(self, inner):
        self.inner, self.sent = inner, []

    async def generate(self, model, row):
        tensors = engine_inputs(row)
        self.sent.append((model, tensors))
        (parsed,) = parse_request(tensors)
        async for item in self.inner.generate(model, parsed):
            yield item


def _sampling_sent(tensors):
    return {n: (tensors[n].dtype, tensors[n].item()) for n in ("runtime_top_k", "runtime_top_p", "temperature")}


def test_greedy_requests_reach_the_engines_as_upstreams_greedy(setup):
    """TensorRT-LLM does not read temperature 0 as greedy: every engine request of a greedy request carries what
    upstream's client sends for greedy (runtime_top_k 1, runtime_top_p 0, temperature 1), and the output stays the
    target's greedy output."""
    from tests.upstream import facts

    engines, decoder = setup
    recorder = _TensorEngines(engines)
    out, stats, _ = run(RowRequest(PROMPTS[2], 16, end_id=EOS), recorder, Deployment(max_draft_len=4))
    assert out == target_only(decoder, PROMPTS[2], 16)
    greedy = facts.load("engine_sampling")["greedy"]
    want = {n: (np.dtype(DTYPES[g["data_type"]]), g["value"]) for n, g in greedy.items() if n != "source"}
    models = {m for m, _ in recorder.sent}
    assert models == {"tensorrt_llm", "tensorrt_llm_draft"} and stats.total_draft_tokens > 0
    for _, tensors in recorder.sent:
        assert _sampling_sent(tensors) == want and "seed" not in tensors


def test_sampled_requests_reach_the_engines_with_their_sampling(setup):
    engines, _ = setup
    recorder = _TensorEngines(engines)
    req = RowRequest(PROMPTS[2], 12, end_id=EOS, sampling=SamplingParams(0.75, 20, 0.5, seed=7))
    run(req, recorder, Deployment(max_draft_len=4))
    assert recorder.sent
    for _, tensors in recorder.sent:
        sent = _sampling_sent(tensors)
        assert sent["runtime_top_k"][1] == 20 and sent["runtime_top_p"][1] == pytest.approx(0.5)
        assert sent["temperature"][1] == pytest.approx(0.75) and tensors["seed"].dtype == np.uint64
        assert sent["runtime_top_k"][1] > 1 or sent["runtime_top_p"][1] > 0  # upstream's test for sampling
