"""The OpenAI frontend's request validation, stop sequences and repository reading, and the bench's workload,
figures, table and plot, without a server (the served behaviour: test_openai_serving.py)."""

from __future__ import annotations

import json

import pytest

from trtspec.serving.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIError,
    check_generation_fields,
    parse_request,
)
from trtspec.serving.openai.text import StopMatcher


def _chat(**kw):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


@pytest.mark.parametrize(
    "body, param",
    [
        (_chat(n=0), "n"),
        (_chat(n=17), "n"),
        (_chat(presence_penalty="0.5"), "presence_penalty"),
        (_chat(top_logprobs=3), "top_logprobs"),  # only with logprobs true (OpenAI's rule)
        (_chat(logprobs=True, top_logprobs=21), "top_logprobs"),
        (_chat(logprobs=True, top_logprobs=-1), "top_logprobs"),
        (_chat(tools=[{"type": "function"}]), "tools"),
        (_chat(stream_options={"include_usage": True}), "stream_options"),
        (_chat(messages=[]), "messages"),
        (_chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages.0.content"),
        (_chat(stop=["a", "b", "c", "d", "e"]), None),
        ({"messages": []}, "model"),
        (_chat(max_tokens="many"), "max_tokens"),
        # strict types (issue 21): no conversion between JSON types
        (_chat(max_tokens="8"), "max_tokens"),
        (_chat(max_tokens=True), "max_tokens"),
        (_chat(max_tokens=8.0), "max_tokens"),
        (_chat(stream="yes"), "stream"),
        (_chat(stream=1), "stream"),
        (_chat(messages=[{"role": "user", "content": None}]), "messages.0.content"),
        (_chat(messages=[{"role": "user"}]), "messages.0.content"),
        (_chat(stop=[1]), "stop"),
        (_chat(response_format={"type": "json_object"}), "response_format"),
    ],
)
def test_chat_requests_that_cannot_be_honoured_are_refused_by_field(body, param):
    from trtspec.serving.openai.protocol import stop_strings

    with pytest.raises(OpenAIError) as exc_info:
        stop_strings(parse_request(ChatCompletionRequest, body))
    e = exc_info.value
    assert e.status == 400 and e.body()["error"]["type"] == "invalid_request_error"
    assert e.param == (param or "stop")


def test_numbers_stay_numbers_under_strict_types():
    """An integer is a valid number (temperature 1), a text part list is valid content."""
    r = parse_request(
        ChatCompletionRequest,
        _chat(temperature=1, top_p=1, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
    )
    assert r.temperature == 1.0 and r.top_p == 1.0 and not r.stream


def test_completion_fields_and_harmless_ones():
    r = parse_request(CompletionRequest, {"model": "m", "prompt": ["one"], "user": "u", "some_tool_field": 1})
    assert r.prompt == ["one"]
    for bad, param in (
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
    ):
        with pytest.raises(OpenAIError) as exc_info:
            parse_request(CompletionRequest, {"model": "m", "prompt": "p", **bad})
        assert exc_info.value.param == param
    with pytest.raises(OpenAIError, match="JSON object"):
        parse_request(CompletionRequest, [1, 2])


@pytest.mark.parametrize(
    "kw, param",
    [
        (dict(max_tokens=("max_completion_tokens", 0)), "max_completion_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(max_tokens=("max_tokens", 2**31)), "max_tokens"),
        (dict(num_draft_tokens=5, max_draft_len=4), "num_draft_tokens"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(seed=-1), "seed"),
        (dict(num_draft_tokens=17), "num_draft_tokens"),
        (dict(num_draft_tokens=-1), "num_draft_tokens"),
        (dict(presence_penalty=2.5), "presence_penalty"),
        (dict(frequency_penalty=-2.5), "frequency_penalty"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(min_tokens=-1), "min_tokens"),
    ],
)
def test_generation_field_values(kw, param):
    sampling = {"temperature": 0.5, "presence_penalty": 0.5, "min_tokens": 2}  # served values
    args = dict(max_tokens=("max_tokens", 8), sampling=sampling, num_draft_tokens=None)
    check_generation_fields(**args)
    head = {k: kw.pop(k) for k in ("max_tokens", "num_draft_tokens", "max_draft_len") if k in kw}
    with pytest.raises(OpenAIError) as exc_info:
        check_generation_fields(**{**args, **head, "sampling": {**sampling, **kw}})
    assert exc_info.value.param == param


def test_penalties_and_min_tokens_are_request_fields():
    r = parse_request(ChatCompletionRequest, _chat(presence_penalty=0.5, repetition_penalty=1.2, min_tokens=3, seed=4))
    assert r.sampling() == {"seed": 4, "repetition_penalty": 1.2, "presence_penalty": 0.5, "min_tokens": 3}


def test_stop_matcher_cuts_at_the_first_stop_and_holds_back_only_possible_starts():
    m = StopMatcher(["END", "\n\n"])
    assert [m.feed(x) for x in ["hello E", "N", "x wor", "ld\n", "\nmore"]] == ["hello ", "", "ENx wor", "ld", ""]
    assert m.stopped and m.flush() == ""
    m = StopMatcher(["END"])
    assert m.feed("abc") == "abc" and m.feed("EN") == "" and m.flush() == "EN"
    assert StopMatcher([]).feed("x") == "x"


def test_served_deployment_maps_container_paths_back_through_the_manifest(tmp_path):
    """The LLM-API model names /checkpoints/target; on this machine the manifest's mounts say where it is."""
    from trtspec.serving.openai.deployment import ServedDeployment

    host = tmp_path / "ckpt"
    host.mkdir()
    repo = tmp_path / "repo"
    (repo / "tensorrt_llm" / "1").mkdir(parents=True)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\nbackend: "python"\nmax_batch_size: 0\n')
    (repo / "tensorrt_llm" / "1" / "model.yaml").write_text(
        "model: /checkpoints/target\nmax_seq_len: 300\nspeculative_config: {decoding_type: DraftTarget, "
        "max_draft_len: 3}\n"
    )
    (repo / "manifest.json").write_text(
        json.dumps(
            {
                "settings": {"name": "served", "engine": {"max_input_len": 100}},
                "container_mounts": [[str(host), "/checkpoints/target"]],
            }
        )
    )
    d = ServedDeployment.from_repo(repo)
    assert (d.name, d.contract, d.entry_model, d.runtime) == ("served", "llmapi", "tensorrt_llm", "trtllm-llmapi")
    assert d.tokenizer_dir == host and (d.max_input_len, d.max_seq_len, d.max_draft_len) == (100, 300, 3)
    assert not d.per_request_draft_len


def test_workloads_from_a_file_and_synthetic(tmp_path):
    from trtspec.errors import GenerationError
    from trtspec.serving.bench import load_workload, synthetic

    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "a b c", "max_tokens": 5}\nplain line\n')
    w = load_workload(f, 9)
    assert [(i.prompt, i.max_tokens) for i in w.items] == [("a b c", 5), ("plain line", 9)]
    f.write_text('{"text": "a", "max_tokens": 0}\n')
    with pytest.raises(GenerationError, match="positive integer"):
        load_workload(f, 9)
    s = synthetic(40, 20, n=50, spread=0.25, seed=1)
    assert s.items == synthetic(40, 20, n=50, spread=0.25, seed=1).items  # reproducible
    outs = [i.max_tokens for i in s.items]
    assert 15 <= min(outs) and max(outs) <= 25 and len(set(outs)) > 3
    words = [len(i.prompt.split()) - 1 for i in s.items]
    assert 30 <= min(words) and max(words) <= 50
    assert "synthetic in~40 out~20" in s.label()


def test_summary_percentiles_and_routed_requests_left_out_of_acceptance():
    from trtspec.serving.bench.clients import Record
    from trtspec.serving.bench.runner import pct, summarize

    assert pct([], 0.5) is None and pct([3, 1, 2], 0.5) == 2 and pct(list(range(101)), 0.99) == 99
    records = [
        Record(tokens=10, ttft=0.1 * i, itl=0.01, latency=1.0, drafted=8, accepted=4, has_acceptance=True)
        for i in range(1, 5)
    ]
    records += [Record(tokens=5, ttft=0.5, itl=0.02, latency=0.5, routed=True), Record(error="boom")]
    s = summarize(records, 2.0)
    assert (s["requests"], s["errors"], s["routed_to_target"], s["output_tokens"]) == (5, 1, 1, 45)
    assert s["acceptance_rate"] == 0.5 and s["output_tok_per_s"] == 22.5 and s["first_error"] == "boom"
    assert s["ttft_p50_s"] <= s["ttft_p90_s"] <= s["ttft_p99_s"] == 0.5
    # No request reported draft statistics (the LLM API's zeroed perf metrics): unavailable, not 0.
    assert summarize([Record(tokens=3, latency=0.1)], 1.0)["acceptance_rate"] is None


def test_speculative_statistics_are_null_when_the_server_reports_none():
    from types import SimpleNamespace

    from trtspec.serving.metrics import Registry
    from trtspec.serving.openai.app import OpenAIService, Prepared
    from trtspec.serving.openai.guard import RequestMetrics

    service = SimpleNamespace(metrics=RequestMetrics(Registry()))  # count() puts a request's tokens on /metrics
    p = Prepared("chat", None, "x", 5, 8, {}, [], 3, False)
    reason, usage, spec = OpenAIService.finish(service, p, {"num_output_tokens": 8})  # type: ignore[arg-type]
    assert reason == "length" and usage == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}
    assert spec["total_draft_tokens"] is None and spec["acceptance_rate"] is None and spec["num_draft_tokens"] == 3
    _, usage, spec = OpenAIService.finish(
        service,  # type: ignore[arg-type]
        p,
        {
            "num_output_tokens": 2,
            "total_draft_tokens": 6,  # type: ignore
            "total_accepted_draft_tokens": 3,
            "acceptance_rate": 0.5,
        },
    )
    assert (spec["total_draft_tokens"], spec["total_accepted_draft_tokens"], spec["acceptance_rate"]) == (6, 3, 0.5)
    OpenAIService.count(service, usage, spec)  # type: ignore[arg-type]
    assert (service.metrics.draft_tokens.value(), service.metrics.accepted_draft_tokens.value()) == (6, 3)


def test_open_loop_arrivals_do_not_wait_for_answers():
    import threading
    import time

    from trtspec.serving.bench.clients import Record
    from trtspec.serving.bench.runner import open_loop
    from trtspec.serving.bench.workload import Item

    in_flight, peak, lock = [0], [0], threading.Lock()

    def send(item):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.3)
        with lock:
            in_flight[0] -= 1
        return Record(tokens=1, latency=0.3)

    records, wall = open_loop(send, [Item("p", 1)], rate=200.0, n_requests=20, seed=0)
    assert len(records) == 20 and peak[0] > 5  # a closed loop of 1 would never overlap


def test_table_and_plot_carry_the_setup(tmp_path):
    from rich.console import Console

    from trtspec.serving.bench import plot_results, render_table

    mode = dict(
        requests=4,
        errors=0,
        routed_to_target=0,
        output_tok_per_s=10.0,
        requests_per_s=1.0,
        acceptance_rate=0.5,
        **{f"{m}_{p}_s": 0.1 for m in ("ttft", "itl", "e2e") for p in ("p50", "p90", "p99")},
    )
    results = {
        "setup": {
            "protocol": "openai",
            "url": "http://x/v1",
            "model": "tiny",
            "runtime": "torch",
            "load": "concurrency",
            "levels": [1, 2],
            "chat": True,
            "prompt_set": "built-in, 12 prompts",
            "modes": [{"mode": "target_only", "num_draft_tokens": 0}, {"mode": "K=2", "num_draft_tokens": 2}],
        },
        "levels": [
            {
                "concurrency": c,
                "modes": [
                    {**mode, "mode": "target_only", "num_draft_tokens": 0, "acceptance_rate": 0.0},
                    {**mode, "mode": "K=2", "num_draft_tokens": 2, "speedup": 1.2},
                ],
            }
            for c in (1, 2)
        ],
        "warnings": [],
    }
    console = Console(record=True, width=250)
    console.print(render_table(results))
    text = console.export_text()
    assert "tiny (torch) via openai" in text and "target-only, K=2" in text and "1.20x" in text
    path = plot_results(results, tmp_path / "p.png")
    assert path.stat().st_size > 10_000
