"""benchmarks/paired.py's ratio of two modes measured in alternation, with its bootstrap interval and verdict, and
benchmarks/workloads_cpu.py's comparison of adaptive speculation with the best fixed configuration through it, on
timings made up to make the answer known."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pr():
    return _load("paired")


@pytest.fixture(scope="module")
def wl():
    return _load("workloads_cpu")


def test_a_uniformly_faster_run_is_faster_by_exactly_its_factor(pr):
    base = [3.0, 1.0, 2.5, 0.7]
    r = pr.paired_ratio(base, [t / 1.25 for t in base])
    assert r["ratio"] == pytest.approx(1.25) and r["lo"] == pytest.approx(1.25) and r["hi"] == pytest.approx(1.25)
    assert pr.verdict(r) == "at least"


def test_pairs_cancel_prompt_length_and_the_interval_is_seeded(pr):
    rng = random.Random(1)
    lengths = [rng.uniform(0.5, 5.0) for _ in range(24)]  # prompts 10x apart in length
    base = [t * rng.uniform(0.97, 1.03) for t in lengths]
    other = [t * rng.uniform(0.97, 1.03) / 0.9 for t in lengths]  # 10 % slower, 3 % noise per pass
    r = pr.paired_ratio(base, other)
    assert r["ratio"] == pytest.approx(0.9, abs=0.02) and r["hi"] < 0.95  # paired, the spread of lengths cancels
    assert pr.verdict(r) == "below"
    assert pr.paired_ratio(base, other) == r  # the same figures, the same interval
    unpaired = pr.paired_ratio(base, [other[(i + 7) % len(other)] for i in range(len(other))])
    assert unpaired["hi"] - unpaired["lo"] > 3 * (r["hi"] - r["lo"])  # what pairing buys


def test_a_small_deficit_inside_the_noise_is_within_noise(pr):
    rng = random.Random(6)  # unpaired noise of +-15 % per pass, 12 passes, 1 % slower on average
    base = [2.0 * rng.uniform(0.85, 1.15) for _ in range(12)]
    other = [2.0 * rng.uniform(0.85, 1.15) / 0.99 for _ in range(12)]
    r = pr.paired_ratio(base, other)
    assert r["lo"] < r["ratio"] < 1.0 <= r["hi"] and pr.verdict(r) == "within noise"
    assert pr.verdict({**r, "hi": 0.999}) == "below" and pr.verdict({**r, "ratio": 1.0}) == "at least"


def test_summary_compares_each_adaptive_configuration_with_each_categorys_best_fixed_one(wl):
    def row(seconds: list[float], target: list[float]) -> dict:
        return {"speedup": sum(target) / sum(seconds), "pass_seconds": seconds}

    target = [2.0, 4.0, 3.0]
    cats = {
        "chat": {  # n-grams fastest; adaptive a little slower on every prompt
            "target-only": row(target, target),
            "ngram:4": row([1.0, 2.0, 1.5], target),
            "model:4": row([1.9, 3.9, 2.9], target),
            "adaptive:4": row([1.05, 2.1, 1.6], target),
        },
        "code": {  # the draft model fastest; adaptive faster still
            "target-only": row(target, target),
            "ngram:4": row([1.6, 3.1, 2.4], target),
            "model:4": row([1.2, 2.5, 1.9], target),
            "adaptive:4": row([1.1, 2.3, 1.8], target),
        },
    }
    s = wl.summary({"categories": cats, "configs": ["ngram:4", "model:4", "adaptive:4"]})
    assert s["best_fixed"] == {"chat": "ngram:4", "code": "model:4"}
    versus = s["versus_best_fixed"]["adaptive:4"]
    assert versus["chat"]["best_fixed"] == "ngram:4" and versus["chat"]["ratio"] == pytest.approx(4.5 / 4.75, abs=1e-4)
    assert versus["chat"]["verdict"] == "below"  # slower on every prompt: every resample is below 1
    assert versus["code"]["best_fixed"] == "model:4" and versus["code"]["verdict"] == "at least"


def test_held_out_the_best_fixed_configuration_is_chosen_on_one_half_and_judged_on_the_other(wl):
    """Two fixed configurations of equal speed, each lucky on alternate passes, and an adaptive one between them:
    after the fact the luckier fixed one beats adaptive; chosen on one half and judged on the other, adaptive wins."""
    target = [2.0, 2.0, 2.0, 2.0]

    def row(seconds: list[float]) -> dict:
        return {"speedup": sum(target) / sum(seconds), "pass_seconds": seconds}

    cats = {
        "chat": {
            "target-only": row(target),
            "ngram:4": row([1.0, 1.2, 1.0, 1.15]),  # fast on passes 0 and 2
            "ngram:2": row([1.2, 1.0, 1.2, 1.0]),  # fast on passes 1 and 3
            "adaptive:4": row([1.1, 1.1, 1.1, 1.1]),
        }
    }
    s = wl.summary({"categories": cats, "configs": ["ngram:4", "ngram:2", "adaptive:4"]})
    after = s["versus_best_fixed"]["adaptive:4"]["chat"]
    assert after["best_fixed"] == "ngram:4" and after["ratio"] == pytest.approx(4.35 / 4.4, abs=1e-4)
    held = s["versus_held_out"]["adaptive:4"]["chat"]
    assert held["best_fixed"] == ["ngram:4", "ngram:2"]  # chosen on passes 0, 2 and on passes 1, 3
    assert held["ratio"] == pytest.approx((1.2 + 1.15 + 1.2 + 1.2) / 4.4, abs=1e-4) and held["verdict"] == "at least"
    assert held["pairs"] == 4


def test_unequal_passes_are_refused(pr):
    with pytest.raises(ValueError, match="3 against 2 passes"):
        pr.paired_ratio([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        pr.paired_ratio([1.0, 2.0], [1.0, 2.0], base_work=[5.0])


def test_rounds_of_unequal_work_are_compared_by_speed(pr):
    """Rounds of requests through a server: tokens and seconds per round, the ratio of tokens per second pooled."""
    base_s, base_tok = [10.0, 12.0, 9.0], [1000.0, 1100.0, 950.0]
    other_s, other_tok = [8.0, 11.0, 9.5], [1010.0, 1090.0, 980.0]
    r = pr.paired_ratio(base_s, other_s, base_tok, other_tok)
    assert r["ratio"] == pytest.approx((3080 / 28.5) / (3050 / 31.0), abs=1e-4) and r["pairs"] == 3
    assert r["lo"] <= r["ratio"] <= r["hi"]
