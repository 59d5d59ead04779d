"""benchmarks/workloads_cpu.py's comparison of adaptive speculation with the best fixed configuration, prompt by prompt:
the paired bootstrap interval and its verdict, on timings made up to make the answer known."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "workloads_cpu.py"


@pytest.fixture(scope="module")
def wl():
    spec = importlib.util.spec_from_file_location("workloads_cpu_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_uniformly_faster_run_is_faster_by_exactly_its_factor(wl):
    base = [3.0, 1.0, 2.5, 0.7]
    r = wl.paired_ratio(base, [t / 1.25 for t in base])
    assert r["ratio"] == pytest.approx(1.25) and r["lo"] == pytest.approx(1.25) and r["hi"] == pytest.approx(1.25)
    assert wl.verdict(r) == "at least"


def test_pairs_cancel_prompt_length_and_the_interval_is_seeded(wl):
    rng = random.Random(1)
    lengths = [rng.uniform(0.5, 5.0) for _ in range(24)]  # prompts 10x apart in length
    base = [t * rng.uniform(0.97, 1.03) for t in lengths]
    other = [t * rng.uniform(0.97, 1.03) / 0.9 for t in lengths]  # 10 % slower, 3 % noise per pass
    r = wl.paired_ratio(base, other)
    assert r["ratio"] == pytest.approx(0.9, abs=0.02) and r["hi"] < 0.95  # paired, the spread of lengths cancels
    assert wl.verdict(r) == "below"
    assert wl.paired_ratio(base, other) == r  # the same figures, the same interval
    unpaired = wl.paired_ratio(base, [other[(i + 7) % len(other)] for i in range(len(other))])
    assert unpaired["hi"] - unpaired["lo"] > 3 * (r["hi"] - r["lo"])  # what pairing buys


def test_a_small_deficit_inside_the_noise_is_within_noise(wl):
    rng = random.Random(6)  # unpaired noise of +-15 % per pass, 12 passes, 1 % slower on average
    base = [2.0 * rng.uniform(0.85, 1.15) for _ in range(12)]
    other = [2.0 * rng.uniform(0.85, 1.15) / 0.99 for _ in range(12)]
    r = wl.paired_ratio(base, other)
    assert r["lo"] < r["ratio"] < 1.0 <= r["hi"] and wl.verdict(r) == "within noise"
    assert wl.verdict({**r, "hi": 0.999}) == "below" and wl.verdict({**r, "ratio": 1.0}) == "at least"


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


def test_unequal_passes_are_refused(wl):
    with pytest.raises(ValueError, match="3 against 2 passes"):
        wl.paired_ratio([1.0, 2.0, 3.0], [1.0, 2.0])
