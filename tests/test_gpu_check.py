"""benchmarks/gpu_check.py end to end on a CPU with tiny random models (`--device cpu --tiny`), so the GPU check
cannot rot between the sessions that are lent a GPU: every section runs and its figures are there and sane."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def run_check(out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRTSPEC_PROGRESS_SECONDS": "60"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu", "--tiny", "--threads", "1", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def check(tmp_path_factory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("gpu-check")
    proc = run_check(out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((out / "results.json").read_text()), proc.stdout, out


@pytest.mark.slow
def test_every_section_runs_on_a_cpu_with_tiny_models_and_says_so_in_one_line(check):
    results, stdout, out = check
    assert {name: s["status"] for name, s in results["sections"].items()} == dict.fromkeys(
        ("workloads", "costs", "quantize", "distill"), "ran"
    )
    assert results["device"] == "cpu" and results["models"] == "tiny random"
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("gpu check on cpu (CPU): ran workloads, costs, quantize, distill; skipped nothing;")
    assert "failed nothing" in last
    summary = (out / "summary.txt").read_text()
    assert "speedup over target-only" in summary and "quantization quality" in summary and last in summary


@pytest.mark.slow
def test_workloads_keep_greedy_identity_for_every_drafter_and_category(check):
    wl = check[0]["sections"]["workloads"]["result"]
    assert wl["device"] == "cpu" and wl["identical_greedy"] is True
    assert set(wl["categories"]) == {"chat", "code", "summarization", "rag", "translation", "math"}
    assert wl["configs"] == ["model:4", "ngram:4", "ngram:2", "hybrid:4", "adaptive:4"]
    for cat in wl["categories"].values():
        assert cat["target-only"]["tokens_per_step"] == pytest.approx(1.0)  # one token a step, the baseline
        for name in wl["configs"]:
            assert cat[name]["identical_greedy"] and cat[name]["speedup"] > 0 and cat[name]["tokens_per_step"] >= 1
    # every drafter proposed (a random tiny draft is rarely accepted, but it must have drafted through the engine)
    for name in ("model:4", "hybrid:4"):
        assert sum(c[name]["draft_tokens"] for c in wl["categories"].values()) > 0
    assert set(wl["summary"]["per_config"]) == set(wl["configs"])
    # every pass timed on its own, so that adaptive is compared with each category's best fixed one prompt by prompt
    for c, cat in wl["categories"].items():
        assert {len(cat[n]["pass_seconds"]) for n in cat} == {wl["prompts_per_category"][c]}
    versus = wl["summary"]["versus_best_fixed"]["adaptive:4"]
    assert set(versus) == set(wl["categories"])
    assert all(v["lo"] <= v["ratio"] <= v["hi"] and v["best_fixed"] != "adaptive:4" for v in versus.values())
    # the same answers replayed on the measured costs: every configuration, and the least-cost decode above them all
    replay = wl["replay"]
    assert set(replay["categories"]) == set(wl["categories"]) and replay["costs"]["c"] > 0
    for row in replay["categories"].values():
        bound = row["least cost K<=4"]["speedup"]
        assert set(wl["configs"]) < set(row) and row["least cost, n-grams K<=4"]["speedup"] <= bound
        assert all(row[name]["speedup"] <= bound + 1e-9 for name in wl["configs"]), row


@pytest.mark.slow
def test_costs_are_positive_and_cover_every_k(check):
    costs = check[0]["sections"]["costs"]["result"]
    assert costs["c"] > 0 and costs["v"] > 0
    assert set(costs["v_by_k"]) == {str(k) for k in range(1, 9)}
    assert all(v > 0 for v in costs["v_by_k"].values())


@pytest.mark.slow
def test_both_models_are_fp8_quantized_with_a_quality_figure(check):
    q = check[0]["sections"]["quantize"]["result"]
    assert {role: m["status"] for role, m in q["models"].items()} == {"target": "built", "draft": "built"}
    for role in ("target", "draft"):
        m = q["quality"]["models"][role]
        assert m["format"] == "fp8"
        assert 0 <= m["top1_agreement"] <= 1 and m["perplexity_after"] > 1
    pair = q["quality"]["draft_target_top1_agreement"]
    assert pair["before"] is not None and pair["after"] is not None


@pytest.mark.slow
def test_distillation_made_its_steps_and_wrote_a_draft(check):
    d = check[0]["sections"]["distill"]["result"]
    rep = d["report"]
    assert d["steps"] == 3 and rep["train_s"] > 0 and math.isfinite(rep["final_loss"])
    assert rep["train_answer_tokens"] > 0 and rep["placement"]["draft_device"] == "cpu"
    assert (Path(d["out"]) / "config.json").is_file() and (Path(d["out"]) / "distill_report.json").is_file()


@pytest.mark.gpu
def test_the_engine_runs_on_cuda_with_its_caches_there_and_greedy_identity(tiny_pair):
    """Where CUDA exists: the in-flight engine follows the model's device (KV pools of target and draft, masks, step
    inputs) and speculative greedy output equals target-only, batched; sampling runs too (a CPU generator)."""
    import torch

    from trtspec.runtimes.torch.decoder import SpeculativeDecoder
    from trtspec.runtimes.torch.loading import load_model
    from trtspec.speculative.rules import SamplingParams

    target = load_model(tiny_pair[0]).to("cuda")
    draft = load_model(tiny_pair[1]).to("cuda")
    dec = SpeculativeDecoder(target, draft, max_draft_len=4, drafter="hybrid")
    prompts = [[5, 17, 33, 2 + i] * 6 for i in range(3)]
    base = dec.generate(prompts, 24, use_draft=False)
    spec = dec.generate(prompts, 24)
    assert [r.token_ids for r in spec] == [r.token_ids for r in base]
    engine = dec._engines[True]
    assert engine.pool.keys[0].device.type == "cuda"
    assert engine.drafter.model.pool.keys[0].device.type == "cuda"
    sampled = dec.generate(prompts[:1], 16, SamplingParams(temperature=0.8, seed=3))
    assert len(sampled[0].token_ids) == 16
    torch.cuda.synchronize()


def test_sections_that_do_not_fit_the_budget_or_were_not_asked_for_are_skipped_and_named(tmp_path):
    proc = run_check(tmp_path, "--sections", "costs,distill", "--budget-s", "0")
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    reasons = {name: s.get("reason", "") for name, s in results["sections"].items()}
    assert all(s["status"] == "skipped" for s in results["sections"].values())
    assert reasons["workloads"] == reasons["quantize"] == "not in --sections"
    assert "budget left" in reasons["costs"] and "budget left" in reasons["distill"]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu check on cpu (CPU): ran nothing; skipped workloads (not in --sections), costs (")
    assert "failed nothing" in last
