"""Good requests to the OpenAI API alone, then the same good requests among hostile ones: their latency and the
server's memory, side by side in one run (loopback only).

    python benchmarks/openai_soak.py [--pair example|tiny] [--requests 96] [--concurrency 4] [--hostile 0.3]
        [--max-tokens 16] [--json benchmarks/results/openai_soak.json]

`trtspec serve REPO --openai-port P --api-key K` on a real tritonserver. Phase 1: N good chat completions (greedy,
half streamed, short questions) at concurrency C. Phase 2: the same N good requests at concurrency C while extra
clients send hostile requests, x of all requests: bodies over the size limit (8 MiB against the default 4 MiB),
100,000-deep JSON, wrong types, prompts over the model's length in characters, streams the client drops after the
first chunk, requests without the key. Reported per phase: p50/p99/max latency of the good requests, their errors and
wrong texts (each good text must equal phase 1's for its prompt), the hostile requests' statuses, and the resident
memory of the server's processes (frontend, tritonserver, stubs) before, after each phase and after a settle.
Exit 1 when a good request failed or changed its text, or a hostile one got a 5xx.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import httpx  # noqa: E402

KEY = "sk-soak-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion to a child.",
    "List three prime numbers.",
    "Why is the sky blue?",
    "Name a famous painting.",
    "How do bees make honey?",
    "What does a CPU do?",
]
HOSTILE = ("oversized", "deep_json", "wrong_types", "too_long", "dropped_stream", "no_key")


def _tree_rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants (MiB)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1024


def _good(client: httpx.Client, name: str, question: str, max_tokens: int, stream: bool) -> tuple[float, str]:
    body = {
        "model": name,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    t0 = time.perf_counter()
    if not stream:
        r = client.post("/chat/completions", json=body, headers=AUTH)
        r.raise_for_status()
        return time.perf_counter() - t0, r.json()["choices"][0]["message"]["content"]
    text = []
    with client.stream("POST", "/chat/completions", json=body, headers=AUTH) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices", []):
                    text.append(choice.get("delta", {}).get("content") or "")
    return time.perf_counter() - t0, "".join(text)


def _hostile(client: httpx.Client, port: int, name: str, kind: str, max_chars: int) -> str:
    """Send one hostile request; returns its status (or what the client did)."""
    if kind == "oversized":
        body = json.dumps({"model": name, "prompt": "x" * (8 << 20), "max_tokens": 4}).encode()
        try:
            return str(client.post("/completions", content=body, headers=AUTH).status_code)
        except httpx.HTTPError:  # the server may close the connection after its 413
            return "closed"
    if kind == "deep_json":
        body = ("[" * 100_000 + "]" * 100_000).encode()
        return str(client.post("/chat/completions", content=body, headers=AUTH).status_code)
    if kind == "wrong_types":
        body = {"model": name, "messages": [{"role": "user", "content": 5}], "max_tokens": "8", "stream": "yes"}
        return str(client.post("/chat/completions", json=body, headers=AUTH).status_code)
    if kind == "too_long":
        body = {"model": name, "prompt": "word " * (max_chars // 4), "max_tokens": 4}
        return str(client.post("/completions", json=body, headers=AUTH).status_code)
    if kind == "no_key":
        body = {"model": name, "prompt": "hello", "max_tokens": 4}
        return str(client.post("/completions", json=body, headers={"Content-Type": "application/json"}).status_code)
    # dropped_stream: a raw socket asks for a long stream, reads the first bytes and closes
    body = json.dumps({"model": name, "prompt": "Tell me a long story.", "max_tokens": 512, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        s.sendall(head.encode() + body)
        first = s.recv(256)
    return "dropped" if first.startswith(b"HTTP/1.1 200") else first.split(b"\r\n", 1)[0].decode(errors="replace")


def _phase(
    base_url: str,
    port: int,
    name: str,
    requests: int,
    concurrency: int,
    hostile_share: float,
    max_tokens: int,
    max_chars: int,
    seed: int,
) -> dict:
    rng = random.Random(seed)
    plan = [(QUESTIONS[i % len(QUESTIONS)], i % 2 == 1) for i in range(requests)]
    hostile_total = round(requests * hostile_share / (1 - hostile_share)) if hostile_share else 0
    hostile_plan = [HOSTILE[i % len(HOSTILE)] for i in range(hostile_total)]
    rng.shuffle(hostile_plan)
    lock = threading.Lock()
    latencies: list[tuple[str, bool, float, str]] = []
    errors: list[str] = []
    statuses: Counter[str] = Counter()
    done_good = threading.Event()

    def good_worker() -> None:
        with httpx.Client(base_url=base_url, timeout=300) as client:
            while True:
                with lock:
                    if not plan:
                        return
                    question, stream = plan.pop()
                try:
                    seconds, text = _good(client, name, question, max_tokens, stream)
                    with lock:
                        latencies.append((question, stream, seconds, text))
                except Exception as exc:  # noqa: BLE001 - every failure of a good request is a finding
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}"[:200])

    def hostile_worker() -> None:
        with httpx.Client(base_url=base_url, timeout=300) as client:
            while not done_good.is_set():
                with lock:
                    if not hostile_plan:
                        return
                    kind = hostile_plan.pop()
                try:
                    status = _hostile(client, port, name, kind, max_chars)
                except Exception as exc:  # noqa: BLE001
                    status = type(exc).__name__
                with lock:
                    statuses[f"{kind} {status}"] += 1

    t0 = time.perf_counter()
    goods = [threading.Thread(target=good_worker) for _ in range(concurrency)]
    bads = [threading.Thread(target=hostile_worker) for _ in range(max(1, concurrency // 2))] if hostile_total else []
    for t in goods + bads:
        t.start()
    for t in goods:
        t.join()
    done_good.set()
    for t in bads:
        t.join()
    wall = time.perf_counter() - t0
    secs = sorted(s for _, _, s, _ in latencies)
    return {
        "good_requests": len(latencies),
        "good_errors": errors,
        "hostile_requests": sum(statuses.values()),
        "hostile_statuses": dict(sorted(statuses.items())),
        "p50_s": round(statistics.median(secs), 3) if secs else None,
        "p99_s": round(secs[min(len(secs) - 1, int(0.99 * len(secs)))], 3) if secs else None,
        "max_s": round(secs[-1], 3) if secs else None,
        "wall_s": round(wall, 1),
        "texts": {(q, s): t for q, s, _, t in latencies},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", choices=["example", "tiny"], default="example")
    ap.add_argument("--requests", type=int, default=96, help="good requests per phase")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--hostile", type=float, default=0.3, help="share of all requests in phase 2 that are hostile")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not 0 <= args.hostile < 1:
        sys.exit("--hostile must be in [0, 1)")

    from rich.console import Console
    from rich.table import Table
    from serving_soak import _write_repo

    from tests.openai_helpers import Served

    console = Console()
    load0 = os.getloadavg()[0]
    console.print(f"load: {load0:.2f} (1 min); pair {args.pair}; {args.requests} good requests per phase")
    root = Path(tempfile.mkdtemp(prefix="trtspec-openai-soak-"))
    repo = _write_repo(root, args.pair, "default", None, 1024)
    server = Served(repo, root / "server.log", args=("--api-key", KEY))
    try:
        base = server.base_url
        port = server.ports["openai"]
        name = httpx.get(base + "/models", headers=AUTH, timeout=30).json()["data"][0]["id"]
        max_chars = 1024 * 64  # past any prompt-length limit in characters of a 1024-token model
        pid = server.proc.pid
        mem = {"before": _tree_rss_mib(pid)}
        _phase(base, port, name, 8, 2, 0.0, args.max_tokens, max_chars, 0)  # warm-up: caches, compiled paths
        mem["after warm-up"] = _tree_rss_mib(pid)
        quiet = _phase(base, port, name, args.requests, args.concurrency, 0.0, args.max_tokens, max_chars, 1)
        mem["after good-only phase"] = _tree_rss_mib(pid)
        hostile = _phase(base, port, name, args.requests, args.concurrency, args.hostile, args.max_tokens, max_chars, 2)
        mem["after hostile phase"] = _tree_rss_mib(pid)
        time.sleep(10)
        mem["10 s later"] = _tree_rss_mib(pid)
        health = server.health()
        traceback_in_log = "Traceback" in server.output()
    finally:
        code = server.stop()
    wrong = sum(1 for key, text in hostile["texts"].items() if quiet["texts"].get(key) not in (None, text))
    five_xx = sum(n for k, n in hostile["hostile_statuses"].items() if k.split()[-1].startswith("5"))
    table = Table(title=f"OpenAI API, {args.pair} pair, good requests at concurrency {args.concurrency}")
    for col in ("phase", "good", "errors", "p50 s", "p99 s", "max s", "hostile", "wall s"):
        table.add_column(col)
    for label, ph in (("good only", quiet), (f"with {args.hostile:.0%} hostile", hostile)):
        table.add_row(
            label,
            str(ph["good_requests"]),
            str(len(ph["good_errors"])),
            str(ph["p50_s"]),
            str(ph["p99_s"]),
            str(ph["max_s"]),
            str(ph["hostile_requests"]),
            str(ph["wall_s"]),
        )
    console.print(table)
    console.print("hostile statuses: " + ", ".join(f"{k}: {n}" for k, n in hostile["hostile_statuses"].items()))
    console.print("memory (MiB, server's process tree): " + ", ".join(f"{k} {v:.0f}" for k, v in mem.items()))
    console.print(
        f"good texts changed by the hostile load: {wrong}; hostile 5xx: {five_xx}; /health after: {health}; "
        f"traceback in the server log: {traceback_in_log}; server exit code {code}; load at the end "
        f"{os.getloadavg()[0]:.2f}"
    )
    out = {
        "pair": args.pair,
        "concurrency": args.concurrency,
        "hostile_share": args.hostile,
        "max_tokens": args.max_tokens,
        "phases": {
            k: {kk: vv for kk, vv in v.items() if kk != "texts"}
            for k, v in (("good_only", quiet), ("hostile", hostile))
        },
        "memory_mib": {k: round(v, 1) for k, v in mem.items()},
        "wrong_texts": wrong,
        "hostile_5xx": five_xx,
        "health_after": health,
        "traceback_in_log": traceback_in_log,
        "load_start": round(load0, 2),
        "load_end": round(os.getloadavg()[0], 2),
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    bad = quiet["good_errors"] or hostile["good_errors"] or wrong or five_xx or traceback_in_log or health != 200
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
