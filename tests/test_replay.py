"""The adaptive policy replayed on reference answers (trtspec.speculative.replay): it takes the real decoder's steps
one for one when both policies' costs are fixed, and the least-cost bound is below every policy's cost."""

from __future__ import annotations

import json
import random

import pytest

from trtspec.speculative.adaptive import AdaptivePolicy
from trtspec.speculative.replay import Answers, least_cost, replay
from trtspec.speculative.speedup import MatchProfile, StepCosts, simulate

PROMPTS = [
    "the cat sat on the mat and the cat sat on the",
    "one two three one two three one two",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "Q: What is the capital of France? A:",
    "a b a b a b a b a b",
]
MAX_TOKENS = 40
COSTS = StepCosts.from_dict({"c": 0.1, "v": {str(k): 1.0 + 0.05 * k for k in range(1, 9)}})


class FixedCostPolicy(AdaptivePolicy):
    """The policy on its prior costs alone: what it is told of timings is dropped, so that the real decoder (timed by
    the machine) and the replay (told the given costs) choose from the same inputs."""

    def observe_target(self, tokens: int, seconds: float, seqs: int = 1) -> None:
        pass

    def observe_verify(self, rows: int, seconds: float) -> None:
        pass

    def observe_draft(self, rows: int, seconds: float) -> None:
        pass

    def anchor(self, target, draft=None) -> None:  # the engine's calibration at start, likewise
        pass


@pytest.mark.slow
def test_the_replay_takes_the_decoder_s_steps_one_for_one(tiny_pair):
    """The adaptive drafter without a draft model (n-grams or nothing per step, K <= 4) through the real decoder, one
    request at a time and one policy for all of them, against its replay on the target-only answers: the same
    number of steps, proposals and accepted proposals, request by request."""
    from trtspec.prompts import encode_prompt
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer
    from trtspec.runtimes.torch.profiling import Reference, replay_answers
    from trtspec.runtimes.torch.session import eos_ids_of

    target, tok = load_model(tiny_pair[0]), load_tokenizer(tiny_pair[0])
    eos = eos_ids_of(target, tok)
    base = SpeculativeDecoder(target, None, eos_ids=eos, pad_id=tok.pad_token_id)
    dec = SpeculativeDecoder(
        target, None, max_draft_len=4, eos_ids=eos, pad_id=tok.pad_token_id, drafter="adaptive",
        policy=FixedCostPolicy(),
    )  # fmt: skip
    ids = [encode_prompt(tok, p) for p in PROMPTS]
    refs, runs = [], []
    for p in ids:
        (ref,) = base.generate([p], MAX_TOKENS, use_draft=False)
        (run,) = dec.generate([p], MAX_TOKENS)
        assert run.token_ids == ref.token_ids  # exact, whatever the policy chose
        refs.append(Reference(list(p), list(ref.token_ids), MAX_TOKENS))
        runs.append(run)
    answers = replay_answers(None, None, refs, 4)
    assert sum(run.stats.total_accepted_draft_tokens for run in runs) > 5  # the n-grams were taken and accepted
    policy = FixedCostPolicy()
    for r, (ref, run) in enumerate(zip(refs, runs)):
        one = Answers(
            MatchProfile(4, [answers.ngram.lengths[r]], [MAX_TOKENS], k_limit=[answers.ngram.k_limit[r]]),
            [answers.ngram_match[r]],
            None,
            [len(ref.prompt)],
        )
        sim = replay(policy, one, COSTS, 4)
        assert (sim.steps, sim.drafted, sim.accepted) == (
            run.stats.target_steps,
            run.stats.total_draft_tokens,
            run.stats.total_accepted_draft_tokens,
        ), r


def _answers(rng: random.Random, n_req: int = 6, n: int = 80) -> Answers:
    """Random answers in runs: stretches where the n-gram proposes long matches (a quote), others where it rarely
    matches, and a draft model accepted now and then."""
    lengths, limits, matches, model = [], [], [], []
    for _ in range(n_req):
        row, lim, m, mod = [], [], [], []
        quote = False
        for _ in range(n):
            if rng.random() < 0.1:
                quote = not quote
            size = rng.choice([0, 2, 4, 4, 6, 8])
            run = size if quote and rng.random() < 0.8 else (1 if rng.random() < 0.2 else 0)
            row.append(min(size, run))
            lim.append(size)
            m.append(4 if quote else 1)
            mod.append(min(8, int(rng.expovariate(1.5))))
        lengths.append(row)
        limits.append(lim)
        matches.append(m)
        model.append(mod)
    return Answers(
        MatchProfile(8, lengths, [n] * n_req, draft_cost=[[0.0] * n for _ in range(n_req)], k_limit=limits),
        matches,
        MatchProfile(8, model, [n] * n_req),
        [100] * n_req,
    )


def test_the_least_cost_decode_bounds_every_policy_and_fixed_k():
    rng = random.Random(0)
    answers = _answers(rng)
    bound = least_cost(answers, COSTS, 8)
    fixed = [simulate(answers.ngram, k, COSTS) for k in range(9)]
    adaptive = replay(AdaptivePolicy(), answers, COSTS, 8)
    assert bound.cost <= min(s.cost for s in fixed) and bound.cost <= adaptive.cost
    assert bound.speedup > max(s.speedup for s in fixed)  # the quotes let a per-step choice beat any fixed K
    # with nothing to propose, the bound is target-only: one step per token
    empty = Answers(
        MatchProfile(4, [[0] * 10], [10], k_limit=[[0] * 10]), [[0] * 10], None, [5]
    )  # fmt: skip
    assert least_cost(empty, COSTS, 4).steps == 10


def test_replayed_adaptive_speculation_is_at_least_the_best_fixed_n_gram_k_where_text_alternates():
    """On answers that alternate between quotes (long n-gram matches) and free text (rare ones), the adaptive
    policy takes long K in the quotes and none outside them: at least the best fixed K's speedup, on costs where a
    verification grows with K."""
    rng = random.Random(1)
    answers = _answers(rng, n_req=12)
    costs = StepCosts.from_dict({"c": 0.1, "v": {str(k): 1.0 + 0.08 * k for k in range(1, 9)}})
    fixed = max(simulate(answers.ngram, k, costs).speedup for k in range(1, 9))
    policy = AdaptivePolicy()
    replay(policy, answers, costs, 8)  # a server that has seen such traffic before
    assert replay(policy, answers, costs, 8).speedup >= fixed


def test_a_step_s_head_is_charged_as_the_engine_computes_it():
    """Up to ``flat_rows`` rows the engine's decide computes every row in one multiply, whatever was accepted; past
    it the first row, then the later K rows in one more multiply when the first proposal was accepted. Without
    ``head_rows`` (costs given by hand) the head is charged per position decided."""
    rows = {n: 0.1 + 0.01 * n for n in range(1, 10)}
    flat = StepCosts(0.1, {k: 0.8 for k in range(9)}, head=0.11, head_rows=rows, flat_rows=8)
    assert flat.head_computed(4, 4) == (5, rows[5]) and flat.head_computed(4, 0) == (5, rows[5])
    assert flat.head_computed(8, 0) == (1, rows[1])  # 9 rows: past flat_rows, the first one alone
    assert flat.head_computed(8, 2) == (9, rows[1] + rows[8])
    assert flat.step(4, 4) == pytest.approx(4 * 0.1 + 0.8 + rows[5])
    per_position = StepCosts(0.1, {k: 0.8 for k in range(9)}, head=0.11)
    assert per_position.head_computed(4, 3) == (4, pytest.approx(0.44))
    again = StepCosts.from_dict(json.loads(json.dumps(flat.to_dict())))
    assert again.head_rows == pytest.approx(rows) and again.flat_rows == 8
