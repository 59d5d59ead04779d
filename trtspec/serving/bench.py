"""`trtspec bench`: a prompt set at several concurrency levels against a served ensemble, with and without the draft.

Each request streams (gRPC), so time to first token and inter-token latency are measured as clients see them.
Output tokens per second counts the tokens the server reports (``num_output_tokens``) over the level's wall time.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from trtspec.errors import GenerationError

BUILTIN_PROMPTS = [
    "What is speculative decoding, in two sentences?",
    "Write a short poem about the sea.",
    "Explain what a hash table is to a ten-year-old.",
    "List three uses of a GPU besides graphics.",
    "What is the capital of France, and why is it famous?",
    "Give me a recipe for pancakes.",
    "Describe the water cycle.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "What are the benefits of regular exercise?",
    "How does a bicycle stay upright?",
]


def load_prompts(path: Path | None) -> list[str]:
    """Prompts from a text file (one a line) or JSONL (``text`` or ``prompt`` field); None: the built-in set."""
    if path is None:
        return list(BUILTIN_PROMPTS)
    if not path.is_file():
        raise GenerationError(f"{path}: no such prompts file", hint="one prompt a line, or JSONL with 'text'")
    prompts = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise GenerationError(f"{path}:{i}: not valid JSON ({exc.msg})", hint="one object a line") from None
            text = item.get("text") or item.get("prompt")
            if not isinstance(text, str):
                raise GenerationError(f"{path}:{i}: no 'text' or 'prompt' string", hint="one object a line")
            prompts.append(text)
        else:
            prompts.append(line)
    if not prompts:
        raise GenerationError(f"{path}: no prompts", hint="one prompt a line")
    return prompts


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]


def run_level(url: str, prompts: list[str], concurrency: int, max_tokens: int, n_requests: int,
              options: dict[str, Any]) -> dict[str, Any]:
    """``n_requests`` prompts (cycled) from ``concurrency`` client threads; one level's figures."""
    from trtspec.serving.client import TritonLLMClient

    lock = threading.Lock()
    next_index = [0]
    records: list[dict[str, Any]] = []
    errors: list[str] = []

    def worker() -> None:
        with TritonLLMClient(url) as client:
            while True:
                with lock:
                    i = next_index[0]
                    if i >= n_requests:
                        return
                    next_index[0] += 1
                try:
                    r = client.generate(prompts[i % len(prompts)], max_tokens, stream=True, **options)
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    with lock:
                        errors.append(str(exc))
                    continue
                n = int(r.stats.get("num_output_tokens", 0))
                times = [t for t, c in zip(r.chunk_times, r.chunks) if c]
                itl = (times[-1] - times[0]) / (n - 1) if n > 1 and len(times) > 1 else None
                with lock:
                    records.append({"tokens": n, "ttft": r.ttft_s, "itl": itl, "latency": r.latency_s,
                                    "drafted": int(r.stats.get("total_draft_tokens", 0)),
                                    "accepted": int(r.stats.get("total_accepted_draft_tokens", 0))})

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in records)
    drafted = sum(r["drafted"] for r in records)
    ttft = [r["ttft"] for r in records if r["ttft"] is not None]
    itl = [r["itl"] for r in records if r["itl"] is not None]
    return {
        "concurrency": concurrency, "requests": len(records), "errors": len(errors), "wall_s": round(wall, 3),
        "output_tokens": tokens, "output_tok_per_s": round(tokens / wall, 2) if wall else 0.0,
        "requests_per_s": round(len(records) / wall, 3) if wall else 0.0,
        "ttft_p50_s": _pct(ttft, 0.5), "ttft_p90_s": _pct(ttft, 0.9),
        "itl_p50_s": _pct(itl, 0.5), "itl_mean_s": statistics.fmean(itl) if itl else None,
        "acceptance_rate": round(sum(r["accepted"] for r in records) / drafted, 4) if drafted else 0.0,
        "first_error": errors[0] if errors else None,
    }


def run_bench(url: str, prompts: list[str], levels: list[int], max_tokens: int, *,
              requests_per_level: int | None = None, baseline: bool = True, chat: bool = True,
              progress: Any = None) -> dict[str, Any]:
    """Every level with the draft (the deployment's K) and, with ``baseline``, target-only (``num_draft_tokens``
    0, the same requests through the same server)."""
    from trtspec.serving.client import TritonLLMClient

    with TritonLLMClient(url) as client:
        client.check_ready()
        # The LLM API model (runtime trtllm-llmapi) drafts for every request: no target-only baseline there.
        baseline = baseline and client.contract != "llmapi"
        for k in (None, 0) if baseline else (None,):  # warm both paths (first requests pay one-time costs)
            client.generate(prompts[0], min(max_tokens, 8), apply_chat_template=chat, num_draft_tokens=k)
    out: dict[str, Any] = {"url": url, "max_tokens": max_tokens, "prompts": len(prompts), "levels": []}
    for c in levels:
        n = requests_per_level or max(2 * c, 4)
        row: dict[str, Any] = {"concurrency": c}
        modes = [("speculative", None)] + ([("target_only", 0)] if baseline else [])
        for name, k in modes:
            if progress is not None:
                progress.print(f"concurrency {c}: {name} ({n} requests)")
            row[name] = run_level(url, prompts, c, max_tokens, n, {"apply_chat_template": chat,
                                                                    "num_draft_tokens": k})
        if baseline and row["target_only"]["output_tok_per_s"]:
            row["speedup"] = round(row["speculative"]["output_tok_per_s"] / row["target_only"]["output_tok_per_s"], 3)
        out["levels"].append(row)
    return out


def render_table(results: dict[str, Any]) -> Any:
    from rich.table import Table

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    table = Table(title=f"trtspec bench {results['url']} (max_tokens {results['max_tokens']})")
    for col in ("conc.", "mode", "req", "out tok/s", "req/s", "TTFT p50 ms", "ITL p50 ms", "acceptance", "speedup"):
        table.add_column(col, justify="right")
    for row in results["levels"]:
        for mode in ("speculative", "target_only"):
            r = row.get(mode)
            if r is None:
                continue
            table.add_row(str(row["concurrency"]), mode, f"{r['requests']}" + (f" ({r['errors']} err)" if
                          r["errors"] else ""), f"{r['output_tok_per_s']:.1f}", f"{r['requests_per_s']:.2f}",
                          ms(r["ttft_p50_s"]), ms(r["itl_p50_s"]), f"{r['acceptance_rate']:.2f}",
                          f"{row['speedup']:.2f}x" if mode == "speculative" and "speedup" in row else "")
    return table


def plot_results(results: dict[str, Any], path: Path) -> Path:
    """Output tok/s and TTFT against concurrency, with and without the draft."""
    from trtspec.errors import require

    require("matplotlib", "serve")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = results["levels"]
    xs = [r["concurrency"] for r in levels]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style in (("speculative", "o-"), ("target_only", "s--")):
        if all(mode in r for r in levels):
            a.plot(xs, [r[mode]["output_tok_per_s"] for r in levels], style, label=mode)
            b.plot(xs, [(r[mode]["ttft_p50_s"] or 0) * 1000 for r in levels], style, label=mode)
    a.set(xlabel="concurrent requests", ylabel="output tokens / s", title="throughput")
    b.set(xlabel="concurrent requests", ylabel="ms", title="time to first token (p50)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
