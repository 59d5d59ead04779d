"""The pure parts of benchmarks/peers_cpu.py (benchmarks/peers/: percentiles, decode time, the stream fold, identity,
table rows, the servers' commands): no installs, no servers. The benchmark itself is run by hand (its docstring says
how)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "peers_cpu.py"


@pytest.fixture(scope="module")
def peers():
    """The script itself, loaded by path as it runs (it puts benchmarks/ on sys.path for its parts in peers/)."""
    spec = importlib.util.spec_from_file_location("peers_cpu", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers_cpu"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("peers_cpu", None)


@pytest.fixture(scope="module")
def records(peers):
    return sys.modules["peers.records"]


@pytest.fixture(scope="module")
def servers(peers):
    return sys.modules["peers.servers"]


def test_percentile_interpolates_like_numpy(records):
    assert records.percentile([], 50) is None
    assert records.percentile([3.0], 90) == 3.0
    assert records.percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert records.percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 90) == pytest.approx(9.1)
    assert records.percentile([1.0, 2.0], 0) == 1.0 and records.percentile([1.0, 2.0], 100) == 2.0


def test_decode_ms(records):
    assert records.decode_ms(2.0, 0.1, 96) == pytest.approx(1.9 / 95 * 1000)
    assert records.decode_ms(2.0, 0.1, 1) is None
    assert records.decode_ms(None, 0.1, 96) is None


def test_stream_state_reads_each_servers_fields(records):
    s = records.StreamState(prompt=2)
    s.event({"choices": [{"delta": {"role": "assistant"}}]}, 0.05)
    s.event({"choices": [{"delta": {"content": "Hel"}}]}, 0.1)
    s.event({"choices": [{"delta": {"content": "lo"}}]}, 0.2)
    s.event({"choices": [{"delta": {"content": " you"}}]}, 0.4)
    s.event({"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens": 9}}, 0.41)
    r = s.finish(0.5)
    assert (r.prompt, r.text, r.tokens, r.ttft, r.latency) == (2, "Hello you", 4, 0.1, 0.5)
    assert r.itl == pytest.approx((0.4 - 0.1) / 3)
    assert r.drafted is None and r.accepted is None

    t = records.StreamState()  # trtspec's extension
    t.event({"choices": [{"delta": {"content": "a"}}], "speculative_decoding": {"total_draft_tokens": 8}}, 0.1)
    t.event({"speculative_decoding": {"total_draft_tokens": 12, "total_accepted_draft_tokens": 5}}, 0.2)
    assert (t.finish(0.3).drafted, t.record.accepted) == (12, 5)

    ll = records.StreamState()  # llama.cpp's timings, and no usage: predicted_n counts the tokens
    ll.event({"choices": [{"delta": {"content": "a"}}]}, 0.1)
    ll.event({"choices": [{"delta": {"content": "b"}}]}, 0.3)
    ll.event({"timings": {"predicted_n": 3, "draft_n": 6, "draft_n_accepted": 2}}, 0.31)
    r = ll.finish(0.4)
    assert (r.tokens, r.drafted, r.accepted) == (3, 6, 2)
    assert r.itl == pytest.approx(0.1)

    c = records.StreamState()  # the client's own count wins over the server's usage (which may count the EOS)
    c.event({"choices": [{"delta": {"content": "one two"}}]}, 0.1)
    c.event({"choices": [{"delta": {"content": " three"}}]}, 0.4)
    c.event({"choices": [], "usage": {"completion_tokens": 4}}, 0.41)
    r = c.finish(0.5, count=lambda text: len(text.split()))
    assert (r.tokens, r.server_tokens) == (3, 4) and r.itl == pytest.approx(0.15)

    with pytest.raises(RuntimeError, match="boom"):
        records.StreamState().event({"error": {"message": "boom"}}, 0.1)


def test_sse_lines(records):
    assert records.parse_sse_line(b"data: [DONE]\n") == "done"
    assert records.parse_sse_line(b": keep-alive\n") is None
    assert records.parse_sse_line(b"\n") is None
    assert records.parse_sse_line(b'data: {"a": 1}\n') == {"a": 1}


def test_prometheus_sum(records):
    text = "\n".join(
        [
            "# HELP vllm:spec_decode_num_draft_tokens_total drafted",
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0',
            'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 2.0',
            'vllm:spec_decode_num_draft_tokens_created{engine="0"} 1.7e9',
            "vllm:spec_decode_num_draft_tokens_total_extra 99",
            "vllm:spec_decode_num_accepted_tokens_total 17",
        ]
    )
    assert records.prometheus_sum(text, "vllm:spec_decode_num_draft_tokens_total") == 42.0
    assert records.prometheus_sum(text, "vllm:spec_decode_num_accepted_tokens_total") == 17.0
    assert records.prometheus_sum(text, "missing_total") is None


def test_identity(records):
    out = records.identity(["abc", "abX", ""], ["abc", "abc", "x"])
    assert out == {"identical": 1, "of": 3, "common_prefix_chars": [3, 2, 0], "reference_chars": [3, 3, 1]}


def test_summarize_and_rows(records):
    recs = [
        records.Record(prompt=i, text="t", tokens=96, ttft=0.1 * (i + 1), itl=0.02, latency=2.0 + i) for i in range(3)
    ]
    recs.append(records.Record(prompt=3, error="HTTP 500"))
    s = records.summarize(recs, wall_s=9.0)
    assert s["requests"] == 4 and s["errors"] == 1 and s["output_tokens"] == 288
    assert s["tok_s"] == pytest.approx(32.0)
    assert s["ttft_p50_s"] == pytest.approx(0.2) and s["e2e_p50_s"] == pytest.approx(3.0)
    assert s["decode_ms"] == pytest.approx((3.0 - 0.2) / 95 * 1000)
    assert s["drafted"] is None
    assert records.acceptance(None, None) is None and records.acceptance(10, 4) == pytest.approx(0.4)

    results = {
        "trtspec": {
            "target": {"c1": s, "acceptance": None, "identity": {"identical": 3, "of": 3}, "c8": {"tok_s": 80.0}},
            "draft": {"error": "exited with 1 before ready"},
        }
    }
    rows = records.table_rows(results)
    assert len(rows) == 2 and all(len(r) == len(records.COLUMNS) for r in rows)
    assert rows[0][:3] == ["trtspec", "target-only", "32.0"]
    assert rows[0][7] == f"{(3.0 - 0.2) / 95 * 1000:.1f}" and rows[0][8] == "-" and rows[0][9] == "3/3"
    assert rows[0][10] == "80.0"
    assert rows[1][2].startswith("failed: exited")
    json.dumps(results)  # what --json writes


def test_server_commands(servers, tmp_path):
    p = servers.Peers(tmp_path)
    ngram = servers.llamacpp_launch("ngram", "float32", p, 8)
    assert "ngram-simple" in ngram.argv and ngram.argv[ngram.argv.index("-np") + 1] == "8"
    draft = servers.llamacpp_launch("draft", "bfloat16", p, 8)
    assert draft.argv[draft.argv.index("-md") + 1].endswith("draft-bf16.gguf")
    v = servers.vllm_launch("draft", "float32", p, Path("/t"), Path("/d"), eager=True)
    config = json.loads(v.argv[v.argv.index("--speculative-config") + 1])
    assert config == {"method": "draft_model", "model": "/d", "num_speculative_tokens": servers.K}
    assert v.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and "--enforce-eager" in v.argv
    assert "--speculative-config" not in servers.vllm_launch("target", "float32", p, Path("/t"), Path("/d"), False).argv
