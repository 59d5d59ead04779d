"""benchmarks/drafts_replayed.py end to end on tiny random models (`--target`), so the comparison of a new draft with
the shipped one cannot rot between the distillations that use it: every draft and category replayed, and the draft
step cost c measured once per draft shape (a deeper draft priced with another draft's c would look free)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "drafts_replayed.py"
CONFIGS = ("model:2", "ngram:2", "adaptive:2")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, tiny_pair, tiny_tokenizer) -> tuple[dict, dict[str, Path]]:
    from tests.tiny import make_llama

    target, shallow = tiny_pair
    root = tmp_path_factory.mktemp("drafts")
    drafts = {
        "shallow": shallow,
        "same shape": make_llama(root / "same-shape", tiny_tokenizer, layers=1, seed=7),
        "deeper": make_llama(root / "deeper", tiny_tokenizer, layers=3, seed=8),
    }
    out = root / "replayed.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *(str(d) for d in drafts.values()),
            "--target",
            str(target),
            "--configs",
            ",".join(CONFIGS),
            "--dtype",
            "float32",
            "--max-tokens",
            "8",
            "--threads",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "drafts replayed" in proc.stdout  # the table
    return json.loads(out.read_text()), drafts


@pytest.mark.slow
def test_every_draft_and_category_is_replayed(replayed):
    result, drafts = replayed
    assert set(result["drafts"]) == {str(d) for d in drafts.values()}
    for rows in result["drafts"].values():
        assert set(rows) == {"chat", "code", "summarization", "rag", "translation", "math"}
        for row in rows.values():
            for name in CONFIGS:
                assert row[name]["tokens_per_step"] >= 1.0 and row[name]["speedup"] > 0


@pytest.mark.slow
def test_the_draft_step_cost_is_measured_once_per_draft_shape(replayed):
    result, drafts = replayed
    c = {name: result["draft_costs"][str(d)] for name, d in drafts.items()}
    assert c["same shape"] == c["shallow"]  # one measurement per shape, its figure reused
    assert c["deeper"] != c["shallow"]  # a draft of another depth timed on its own
    assert result["costs"]["c"] == c["shallow"]  # the first draft's measurement prices the target for every draft
