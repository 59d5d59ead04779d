"""The adaptive drafters (trtspec.speculative.drafters.adaptive) and the realized gate (trtspec.speculative.gate): the
BLS orchestrator's per-request planning against the whole batch's step, the engine drafter's skipped plans and its
gate, and exactness through the decoder whatever the policy chooses (greedy identity batched and not)."""

from __future__ import annotations

import types

import pytest

from tests.adaptive_helpers import SwitchingPolicy, cpu_like_policy
from trtspec.speculative.adaptive import AdaptivePolicy
from trtspec.speculative.arms import MODEL, NGRAM
from trtspec.speculative.choice import Choice


def _serve_bls_steps(drafter, requests: int, steps: int, pass_s, accept: float) -> float:
    """``requests`` BLS requests in lockstep through the adaptive drafter: each step every request plans, the target
    engine runs them as one pass of ``pass_s(requests, tokens)`` seconds (every call's latency), and each proposal is
    accepted token by token with probability ``accept``. Returns the share of request steps that speculated after
    the first ``steps // 4`` (the first feeds the prompt, which teaches no pass cost: its prefix may be cached)."""
    import random

    rng = random.Random(0)
    prompt = [7, 8, 9, 10, 11] * 6  # prompt lookup always finds a match
    clock = [0.0]
    drafter.clock = lambda: clock[0]  # every request's step takes the pass's seconds
    states = [drafter.new_state() for _ in range(requests)]
    speculated = 0
    for step in range(steps):
        planned = [drafter.plan(s, prompt, 4) for s in states]
        fed = sum((len(prompt) if step == 0 else 1) + len(tokens or []) for tokens, _ in planned)
        seconds = pass_s(requests, fed)
        clock[0] += seconds
        for s, (tokens, _) in zip(states, planned):
            n = len(tokens or [])
            accepted = 0
            while accepted < n and rng.random() < accept:
                accepted += 1
            drafter.verdict(s, n, accepted, target_s=seconds)
            speculated += n > 0 and step >= steps // 4
    for s in states:
        drafter.finish(s)
    assert drafter.in_flight == 0
    return speculated / (requests * (steps - steps // 4))


def test_the_bls_drafter_prices_a_draft_at_the_whole_batch_s_step():
    """The BLS orchestrator plans each request alone, but the target engine runs every request in flight in one pass,
    so a call's latency is the whole batch's step. A compute-bound pass at 8 requests (each token 4 ms of a 40 ms
    step) makes a 0.35-acceptance draft a loss there, and a cheap one at 1 request (1 ms of 30) a gain: the drafter
    speculates alone and steps aside at 8. Learned as each request's own pass over its own tokens (as it once was),
    the latency hardly moved with a request's draft, every draft looked free, and all 8 speculated (0.56x
    target-only through Triton)."""
    from trtspec.speculative.drafters.adaptive import AdaptiveLocalDrafter
    from trtspec.speculative.drafters.ngram import NgramDrafter

    def pass_s(seqs: int, tokens: int) -> float:
        return 0.030 + 0.001 * (tokens - 1) if seqs == 1 else 0.040 + 0.004 * (tokens - seqs)

    def drafter() -> AdaptiveLocalDrafter:
        return AdaptiveLocalDrafter(NgramDrafter(None), has_model=False, policy=cpu_like_policy(explore=0.0))

    assert _serve_bls_steps(drafter(), 1, 60, pass_s, accept=0.35) > 0.8
    # at 8, about one request of the eight takes the cheapest draft (K 1) on a step, not all eight: a plain pass's
    # cost is learned from passes where another request's draft was counted at its last choice, a little above
    # the truth
    assert _serve_bls_steps(drafter(), 8, 60, pass_s, accept=0.35) < 0.2
    # where the batch's pass grows little with its tokens (memory-bound), nearly every request speculates on each
    # step: a pass larger than those timed is priced on the measured slope (on the prior's, as it once was, no
    # request alone made the pass grow past the sizes timed, and about half of them speculated: 0.44)
    assert _serve_bls_steps(drafter(), 8, 60, lambda b, n: 0.040 + 0.0001 * (n - b), accept=0.35) > 0.8
    assert _serve_bls_steps(drafter(), 8, 60, lambda b, n: 0.040 + 0.0001 * (n - b), accept=0.6) > 0.8


def test_the_realized_gate_closes_per_batch_size_where_speculating_did_not_pay_and_probes():
    from trtspec.speculative.gate import RealizedGate

    gate = RealizedGate(probe_every=4)
    for _ in range(3):
        gate.observe(8, False, 32, 32 * 0.040)  # plain stretches: 25 tokens/s
    for _ in range(5):
        gate.observe(8, True, 1, 0.060)  # speculative steps: 1 token in 60 ms, 16.7 tokens/s
    assert gate.allows(8)  # not enough evidence yet
    gate.observe(8, True, 1, 0.060)
    allowed = [gate.allows(8) for _ in range(8)]
    assert allowed == [False, False, False, True] * 2  # closed, one plan in probe_every goes through
    assert gate.closed_plans == 6 and gate.snapshot()[8]["closed"] is True
    assert gate.allows(2) and gate.allows(16)  # other batch sizes have their own evidence
    for _ in range(20):  # the text became predictable: speculative steps now commit 3 tokens in 60 ms
        gate.observe(8, True, 3, 0.060)
    assert all(gate.allows(8) for _ in range(8))


class _EagerPolicy(AdaptivePolicy):
    """Speculates for every sequence with an n-gram proposal, as long as it may, whatever it costs: a policy whose
    estimates are wrong at a batch."""

    def plan(self, seqs, asks, batch_seqs=None, others=None):
        out = []
        for seq, ask in zip(seqs, asks):
            k = min(ask.k_max, len(ask.ngram_tokens))
            choice = Choice(NGRAM, k, (NGRAM, 4)) if k else Choice()
            seq.last = (choice.arm, choice.k) if choice.speculates else None
            out.append(choice)
        return out


def test_the_bls_drafter_steps_aside_where_its_speculation_did_not_pay_as_the_requests_saw_it():
    """A policy that always speculates (mispriced: the pass model misses what a call costs at a batch) at 8 requests
    in flight, where a speculative step is an engine call that waits for the batch's step boundary (1.3 tokens in
    90 ms) and a plain stretch streams a token every 40 ms: the gate stops the drafts at 8 (but for its probes)
    and the plain stretches grow to gated_run; alone, nothing is gated."""
    from trtspec.speculative.drafters.adaptive import AdaptiveLocalDrafter
    from trtspec.speculative.drafters.ngram import NgramDrafter

    clock = [0.0]
    prompt = [7, 8, 9, 10, 11] * 6  # prompt lookup always finds a match

    def serve(requests: int, steps: int) -> tuple[int, list[int]]:
        d = AdaptiveLocalDrafter(NgramDrafter(None), has_model=False, policy=_EagerPolicy())
        d.clock = lambda: clock[0]
        states = [d.new_state() for _ in range(requests)]
        drafted, runs = 0, []
        for step in range(steps):
            for s in states:  # each request's loop on its own clock offset; the others in flight as they chose
                tokens, _ = d.plan(s, prompt, 4)
                if tokens:
                    clock[0] += 0.090
                    d.verdict(s, len(tokens), 0 if step % 3 else 1, target_s=0.090)
                    drafted += step >= steps // 2
                else:
                    run = d.plain_run(s)
                    clock[0] += 0.040 * run
                    d.verdict(s, 0, 0, target_s=0.040 * run, plain_tokens=run)
                    runs.append(run)
        return drafted, runs

    drafted, runs = serve(8, 40)
    assert drafted <= 8 * 20 / 8 + 8  # about one plan in probe_every, after the evidence closed the gate
    assert max(runs) == AdaptiveLocalDrafter(NgramDrafter(None), has_model=False).gated_run
    drafted, runs = serve(1, 40)
    assert drafted == 20 and not runs  # alone: the pass model prices a call as it is, nothing is gated


@pytest.fixture(scope="module")
def tiny_models(tiny_pair):
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer

    return load_model(tiny_pair[0]), load_model(tiny_pair[1]), load_tokenizer(tiny_pair[0])


PROMPTS = ["The quick brown", "def add(a, b):\n    return a", "Q: What is the capital of France? A:", "the lazy dog"]


@pytest.mark.parametrize("policy_cls", [SwitchingPolicy, AdaptivePolicy])
def test_adaptive_drafting_is_greedy_lossless_batched_and_not(tiny_models, policy_cls):
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder
    from trtspec.speculative.drafters.ngram import NgramPool

    target, draft, tok = tiny_models
    prompts = [tok.encode(p) for p in PROMPTS]
    base = SpeculativeDecoder(target, None)
    reference = [base.generate([p], 40)[0].token_ids for p in prompts]
    pool = NgramPool.from_sequences([p + r for p, r in zip(prompts[::2], reference[::2])], vocab_size=len(tok))
    policy = policy_cls()
    dec = SpeculativeDecoder(target, draft, max_draft_len=4, drafter="adaptive", ngram_pool=pool, policy=policy)
    single = [dec.generate([p], 40)[0] for p in prompts]
    assert [r.token_ids for r in single] == reference
    batch = dec.generate(prompts, 40)
    assert [r.token_ids for r in batch] == reference
    if policy_cls is SwitchingPolicy:  # every choice was exercised, drafts accepted and rejected
        assert all(policy.steps[s] > 0 for s in (NGRAM, MODEL, "none")), policy.steps
        drafted = sum(r.stats.total_draft_tokens for r in single + batch)
        accepted = sum(r.stats.total_accepted_draft_tokens for r in single + batch)
        assert drafted > accepted > 0
        assert all(r.stats.no_draft_steps > 0 for r in batch)
    else:  # the real policy learned the target's pass costs from the engine's passes
        assert policy.target.seconds, policy.snapshot()
        # ... and the verification's cost by rows kept (head and acceptance routine), a pass of 4 sequences included
        assert policy.verify.seconds and max(policy.verify.seconds) >= len(prompts), policy.snapshot()
        # ... per number of sequences in the pass: alone (the single runs) and the four of the batch
        assert {1, len(prompts)} <= set(policy.target.curves), policy.snapshot()


def test_calibrate_anchors_the_policy_on_the_engine_s_passes(tiny_models):
    """At an engine's start (calibrate_costs) the policy's curves are anchored on passes timed here, per batch size up
    to the engine's, and decoding stays the target's."""
    from trtspec.runtimes.inflight.engine import InflightEngine
    from trtspec.speculative.drafters.adaptive import AdaptiveEngineDrafter
    from trtspec.speculative.drafters.ngram import NgramDrafter

    target, _draft = tiny_models[:2]
    policy = AdaptivePolicy()
    drafter = AdaptiveEngineDrafter(NgramDrafter(), int(target.config.vocab_size), policy=policy)
    InflightEngine(target, drafter=drafter, max_batch_size=4, calibrate_costs=True)
    assert policy.calibrated == {1, 2, 4}
    snap = policy.snapshot()["target_anchor_s"]
    assert set(snap) >= {1, 2, 4} and sorted(snap[1]) == [1, 2, 3, 4, 5, 7, 9]
    assert all(t > 0 for c in snap.values() for t in c.values())


class _Job:
    """What the engine drafter reads of a job: its sequence, the tokens it feeds anyway, its sampling."""

    def __init__(self, tokens, sampling=None):
        self.tokens, self.pending, self.sampling, self.draft_state = list(tokens), [tokens[-1]], sampling, None
        self.stats = types.SimpleNamespace(draft_s=0.0)

    def history(self):
        return self.tokens


class _QuietPolicy(AdaptivePolicy):
    """Chooses no speculation for anybody, except at the plans numbered in ``speculate_at`` (n-grams, K 1)."""

    def __init__(self, speculate_at=()):
        super().__init__()
        self.plans, self.speculate_at = [], set(speculate_at)

    def plan(self, seqs, asks, batch_seqs=None):
        self.plans.append(batch_seqs)
        if len(self.plans) - 1 in self.speculate_at:
            return [Choice(NGRAM, 1, (NGRAM, 1)) if a.ngram_tokens else Choice() for a in asks]
        self.record_plain(len(seqs))
        return [Choice() for _ in seqs]


def _drafter(policy, jobs):
    from trtspec.speculative.drafters.adaptive import AdaptiveEngineDrafter
    from trtspec.speculative.drafters.ngram import NgramDrafter

    drafter = AdaptiveEngineDrafter(NgramDrafter(), 100, policy=policy)
    for job in jobs:
        drafter.admit(job)
    return drafter


def _step(drafter, jobs):
    out = drafter.propose(jobs, [4] * len(jobs), batch_tokens=len(jobs), batch_seqs=len(jobs))
    for job, p in zip(jobs, out):
        drafter.commit(job, len(job.tokens), len(p.tokens), 0)
    return out


def test_the_engine_drafter_stops_choosing_where_nobody_speculates_and_plans_again_when_the_batch_shrinks():
    """At a batch where the plan speculated for nobody, proposing and choosing are the only loss (36.7 against 34.8
    ms a step at 8 conversations): the drafter skips them for 1, 2, 4, 8, 16 steps after each such plan in a row."""
    repeat = [5, 6, 7, 5, 6, 7, 5, 6]  # every job has an n-gram proposal
    jobs = [_Job(repeat) for _ in range(4)]
    policy = _QuietPolicy()
    drafter = _drafter(policy, jobs)
    outs = [_step(drafter, jobs) for _ in range(40)]
    assert all(not p.tokens for out in outs for p in out)
    assert len(policy.plans) == 6  # plans at steps 0, 2, 5, 10, 19, 36; the others skipped
    assert drafter.skipped_steps == 34 and policy.steps["none"] == 40 * 4 and policy.k_chosen[0] == 160
    _step(drafter, jobs[:3])  # the batch shrank: fewer sequences may pay, so it plans at once
    assert len(policy.plans) == 7 and policy.plans[-1] == 3
    # a batch of one is never skipped (alone, speculation is judged every step)
    one = [_Job(repeat)]
    alone = _QuietPolicy()
    drafter = _drafter(alone, one)
    for _ in range(5):
        _step(drafter, one)
    assert len(alone.plans) == 5 and drafter.skipped_steps == 0


def test_a_plan_that_speculates_or_a_seeded_request_keeps_the_drafter_choosing_every_step():
    from trtspec.speculative.rules import SamplingParams

    repeat = [5, 6, 7, 5, 6, 7, 5, 6]
    jobs = [_Job(repeat) for _ in range(4)]
    policy = _QuietPolicy(speculate_at={2})
    drafter = _drafter(policy, jobs)
    outs = [_step(drafter, jobs) for _ in range(6)]
    # plan 0 (step 0) quiet -> skip step 1; plan 1 (step 2) quiet -> skip 3, 4; plan 2 (step 5) speculates
    assert len(policy.plans) == 3 and [bool(o[0].tokens) for o in outs] == [False] * 5 + [True]
    _step(drafter, jobs)  # after a plan that speculated: no skipping
    assert len(policy.plans) == 4
    # a seeded sampled request's choices must not depend on the batch: with one in it, every step plans
    seeded = [_Job(repeat, SamplingParams(temperature=0.8, seed=1))] + [_Job(repeat) for _ in range(3)]
    policy = _QuietPolicy()
    drafter = _drafter(policy, seeded)
    for _ in range(6):
        _step(drafter, seeded)
    assert len(policy.plans) == 6 and drafter.skipped_steps == 0


def _timed_steps(drafter, jobs, steps, spec_s, plain_s, accepted, feed=1):
    """``steps`` engine steps on a fake clock: a speculative step takes ``spec_s`` and accepts ``accepted`` per
    sequence, a plain one ``plain_s``; each sequence feeds ``feed`` tokens (more than 1: a prompt's); returns which
    steps speculated."""
    clock = [0.0]
    drafter.clock = lambda: clock[0]
    spoke = []
    for _ in range(steps):
        out = drafter.propose(jobs, [4] * len(jobs), batch_tokens=feed * len(jobs), batch_seqs=len(jobs))
        speculated = any(p.tokens for p in out)
        clock[0] += spec_s if speculated else plain_s
        drafter.observe_pass(len(jobs), 0.001, seqs=len(jobs))
        for job, p in zip(jobs, out):
            drafter.commit(job, len(job.tokens), len(p.tokens), accepted if p.tokens else 0)
        spoke.append(speculated)
    return spoke


def test_the_engine_drafter_gates_a_batch_size_where_speculating_realized_less_than_plain_steps():
    """A policy that always speculates at 4 sequences, where a speculative step takes 60 ms for 1.25 tokens a
    sequence and a plain one 40 ms for 1 (20.8 against 25 tokens/s a sequence): once the gate has the evidence it
    passes one plan in probe_every (the probe, speculative), and the rest are plain steps; where speculation pays
    (2 tokens a sequence in 60 ms) nothing is gated, nor is a sequence alone however it does."""
    repeat = [5, 6, 7, 5, 6, 7, 5, 6]  # every job has an n-gram proposal
    jobs = [_Job(repeat) for _ in range(4)]
    drafter = _drafter(_EagerPolicy(), jobs)
    for _ in range(3):  # plain steps to weigh against (the gate asks for a few of each kind)
        drafter.gate.observe(4, False, 4, 0.040)
    spoke = _timed_steps(drafter, jobs, 64, spec_s=0.060, plain_s=0.040, accepted=0.25)
    assert all(spoke[:5])  # no evidence yet
    late = spoke[32:]
    assert sum(late) == len(late) // drafter.gate.probe_every  # probes only
    assert drafter.gate.snapshot()[4]["closed"] is True

    jobs = [_Job(repeat) for _ in range(4)]
    drafter = _drafter(_EagerPolicy(), jobs)
    for _ in range(3):
        drafter.gate.observe(4, False, 4, 0.040)
    spoke = _timed_steps(drafter, jobs, 64, spec_s=0.060, plain_s=0.040, accepted=1)
    assert all(spoke) and drafter.gate.snapshot()[4]["closed"] is False

    # steps that feed prompts are not evidence (a prefill's cost is paid whatever the choice)
    jobs = [_Job(repeat) for _ in range(4)]
    drafter = _drafter(_EagerPolicy(), jobs)
    assert all(_timed_steps(drafter, jobs, 16, spec_s=0.060, plain_s=0.040, accepted=0, feed=3))
    assert drafter.gate.snapshot() == {4: {"spec_tok_s": 0.0, "plain_tok_s": 0.0, "closed": False}}

    one = [_Job(repeat)]
    drafter = _drafter(_EagerPolicy(), one)
    for _ in range(3):
        drafter.gate.observe(1, False, 1, 0.010)
    assert all(_timed_steps(drafter, one, 32, spec_s=0.060, plain_s=0.010, accepted=0))
    assert drafter.gate.snapshot() == {1: {"spec_tok_s": 0.0, "plain_tok_s": 100.0, "closed": False}}


class _PhasedPolicy(SwitchingPolicy):
    """SwitchingPolicy's choices at every fourth plan, no speculation for anybody at the others: the engine drafter
    then skips steps, and comes back."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.plans = 0

    def plan(self, seqs, asks, batch_seqs=None):
        self.plans += 1
        if self.plans % 4 == 1:
            return super().plan(seqs, asks, batch_seqs)
        self.record_plain(len(seqs))
        return [Choice() for _ in seqs]


def test_skipped_steps_keep_adaptive_drafting_greedy_lossless_batched(tiny_models):
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder

    target, draft, tok = tiny_models
    prompts = [tok.encode(p) for p in PROMPTS]
    base = SpeculativeDecoder(target, None)
    reference = [base.generate([p], 40)[0].token_ids for p in prompts]
    policy = _PhasedPolicy()
    dec = SpeculativeDecoder(target, draft, max_draft_len=4, drafter="adaptive", policy=policy)
    batch = dec.generate(prompts, 40)
    assert [r.token_ids for r in batch] == reference
    drafter = dec._engines[True].drafter
    assert drafter.skipped_steps > 0 and policy.steps[MODEL] > 0, policy.steps
    assert sum(r.stats.total_draft_tokens for r in batch) > 0
