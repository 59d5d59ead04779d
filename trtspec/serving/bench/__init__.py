"""`trtspec bench`: a workload at several load levels against a served deployment, through Triton's protocol
(gRPC / HTTP) or the OpenAI-compatible API, target-only beside one or more draft lengths K.

Every request streams, so time to first token (TTFT) and inter-token latency (ITL: time per output token after the
first) are what a client sees; end-to-end latency too. Throughput counts the output tokens the server reports over the
run's wall time. Requests below the deployment's route threshold are served by the target alone: they are counted as
``routed_to_target`` and left out of the acceptance rate, and the run warns about them. Speedup is a mode's output
tokens per second over target-only's at the same load.
"""

from __future__ import annotations

import math
from typing import Any

from trtspec.errors import GenerationError
from trtspec.serving.bench.clients import OpenAIRequester, Record, TritonRequester
from trtspec.serving.bench.report import plot_results, render_table, title
from trtspec.serving.bench.runner import closed_loop, open_loop, summarize
from trtspec.serving.bench.workload import BUILTIN_PROMPTS, Item, Workload, load_prompts, load_workload, synthetic

__all__ = [
    "BUILTIN_PROMPTS",
    "OpenAIRequester",
    "TritonRequester",
    "Workload",
    "load_prompts",
    "load_workload",
    "plot_results",
    "render_table",
    "run_bench",
    "run_level",
    "synthetic",
    "title",
]
LOADS = ("concurrency", "request_rate")


def _modes(info: dict[str, Any], num_draft_tokens: list[int] | None, baseline: bool, warnings: list[str]) -> list:
    if not info["per_request_draft_len"]:
        if num_draft_tokens:
            raise GenerationError(
                f"--num-draft-tokens: this deployment ({info['runtime']}) applies its own K to every request",
                hint="leave --num-draft-tokens out; K is the spec's max_draft_len",
            )
        if baseline:
            warnings.append(f"no target-only baseline: the {info['runtime']} deployment drafts every request")
        return [("speculative", None)]
    cap = info.get("max_draft_len")
    for k in num_draft_tokens or []:
        if cap and k > cap and info["runtime"] == "trtllm-engine":
            warnings.append(f"K={k} is above the engines' max_draft_len ({cap}): those requests will fail")
    spec = [(f"K={k}", k) for k in num_draft_tokens] if num_draft_tokens else [("speculative", None)]
    return ([("target_only", 0)] if baseline else []) + spec


def run_bench(
    requester: Any,
    workload: Workload,
    levels: list[float],
    *,
    load: str = "concurrency",
    num_draft_tokens: list[int] | None = None,
    baseline: bool = True,
    chat: bool = True,
    requests_per_level: int | None = None,
    seed: int = 0,
    progress: Any = None,
) -> dict[str, Any]:
    """Every level in every mode (target-only, then each K; or the deployment's K); the results and the setup."""
    if load not in LOADS:
        raise GenerationError(f"unknown load {load!r}", hint=" or ".join(LOADS))
    info = requester.describe()
    warnings: list[str] = []
    modes = _modes(info, num_draft_tokens, baseline, warnings)
    threshold = int(info.get("route_threshold") or 0)
    short = sum(1 for i in workload.items if i.max_tokens < threshold)
    if short and any(k != 0 for _, k in modes):
        warnings.append(
            f"{short} of {len(workload.items)} prompts ask for fewer than the route threshold "
            f"({threshold}) tokens: the server sends them to the target alone; they are counted as "
            "routed_to_target, not as speculative"
        )
    for _, k in modes:  # warm every path: first requests pay one-time costs
        requester.send(workload.items[0].prompt, max(8, threshold), k, chat)
    results: dict[str, Any] = {
        "setup": {
            "protocol": requester.protocol,
            "url": requester.url,
            **info,
            "load": load,
            "levels": levels,
            "modes": [
                {"mode": name, "num_draft_tokens": info.get("max_draft_len") if k is None else k} for name, k in modes
            ],
            "prompt_set": workload.label(),
            "workload": workload.describe(),
            "chat": chat,
            "temperature": 0.0,
            "requests_per_level": requests_per_level,
            "seed": seed,
        },
        "warnings": warnings,
        "levels": [],
    }
    for level in levels:
        if load == "concurrency":
            n = requests_per_level or max(2 * int(level), 4)
        else:
            n = requests_per_level or max(8, math.ceil(10 * level))
        row: dict[str, Any] = {load: level, "modes": []}
        for name, k in modes:
            if progress is not None:
                progress.print(f"{load.replace('_', ' ')} {level}: {name} ({n} requests)")

            def send(item: Item, k: int | None = k) -> Record:
                return requester.send(item.prompt, item.max_tokens, k, chat)

            if load == "concurrency":
                records, wall = closed_loop(send, workload.items, int(level), n)
            else:
                records, wall = open_loop(send, workload.items, float(level), n, seed=seed)
            fig = summarize(records, wall)
            fig.update(mode=name, num_draft_tokens=info.get("max_draft_len") if k is None else k)
            if k != 0 and fig["requests"] and fig["routed_to_target"] == fig["requests"]:
                warnings.append(f"{load} {level}, {name}: every request was routed to the target (no drafting)")
            row["modes"].append(fig)
        base = next((m for m in row["modes"] if m["mode"] == "target_only"), None)
        for m in row["modes"]:
            if base is not None and m is not base and base["output_tok_per_s"]:
                m["speedup"] = round(m["output_tok_per_s"] / base["output_tok_per_s"], 3)
        results["levels"].append(row)
    return results


def run_level(
    url: str, prompts: list[str], concurrency: int, max_tokens: int, n_requests: int, options: dict[str, Any]
) -> dict[str, Any]:
    """One closed-loop level over Triton gRPC (``options``: apply_chat_template, num_draft_tokens): its figures."""
    requester = TritonRequester(url)
    try:
        items = [Item(p, max_tokens) for p in prompts]
        k, chat = options.get("num_draft_tokens"), bool(options.get("apply_chat_template", True))
        records, wall = closed_loop(
            lambda i: requester.send(i.prompt, i.max_tokens, k, chat), items, concurrency, n_requests
        )
        return {"concurrency": concurrency, **summarize(records, wall)}
    finally:
        requester.close()
