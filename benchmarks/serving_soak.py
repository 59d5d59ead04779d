"""Soak a served repository with a bounded mixed load and count what went wrong (loopback only).

    python benchmarks/serving_soak.py [--pair example|tiny] [--orchestration in_process|bls] [--requests 1000]
        [--concurrency 16] [--malformed 0.1] [--max-tokens 32] [--time-limit 1800] [--json out.json]

Good requests are greedy, half streamed; each one's text must equal the text the same server gave that prompt at
concurrency 1. Malformed requests (10 %: missing text_input, max_tokens 0 and -1, invalid UTF-8, a prompt beyond
max_seq_len) must each get an error. Reported: dead stubs (and dmesg segfaults where readable), errors on good
requests, wrong texts, hangs, malformed requests answered without an error, backend failures counted by Triton,
output tokens per second. Target: 0, 0, 0, 0. ``--trtspec-root DIR`` serves another checkout of trtspec (e.g. a
worktree of an older commit) to measure the code before a fix with the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion to a child.",
    "List three prime numbers.",
    "What is speculative decoding?",
    "Describe a cat in one sentence.",
    "Why is the sky blue?",
    "Give me a tip for learning Python.",
    "What does a CPU do?",
    "Name a famous painting.",
    "How do bees make honey?",
    "What is 12 times 12?",
]


def _write_repo(root: Path, pair: str, orchestration: str, trtspec_root: Path | None, max_seq_len: int) -> Path:
    """Write the repository in a child process (with ``trtspec_root`` first on the path when given)."""
    script = f"""
import sys, json
from pathlib import Path
sys.path.insert(0, {str(ROOT / "tests")!r})
from trtspec.spec import spec_from_dict
from trtspec.pipeline import write_repo
root = Path({str(root)!r})
if {pair!r} == "tiny":
    from tiny import make_tokenizer, make_llama
    from serving_helpers import make_noisy_draft, torch_spec_dict
    tok = make_tokenizer(root / "tok")
    make_llama(root / "target", tok, layers=4, seed=0)
    make_noisy_draft(root / "target", root / "draft")
    data = torch_spec_dict(root / "target", root / "draft", speculative={{"route_threshold": 8}},
                           engine={{"max_seq_len": {max_seq_len}}}, triton={{"orchestrator_instances": 4}})
else:
    from trtspec.example import example_models, example_spec_dict
    paths = example_models()
    data = example_spec_dict(paths.target, paths.draft)
    data.setdefault("engine", {{}})["max_seq_len"] = {max_seq_len}
    data["engine"]["max_input_len"] = min(data["engine"].get("max_input_len", 1024), {max_seq_len} - 1)
if {orchestration!r} != "default":
    data.setdefault("triton", {{}})["orchestration"] = {orchestration!r}
spec = spec_from_dict(data, base_dir=root, environ={{}})
write_repo(spec, force=True)
print(spec.repo_dir)
"""
    env = dict(os.environ)
    if trtspec_root is not None:
        env["PYTHONPATH"] = str(trtspec_root)
    # cwd: the repository's root directory, not this checkout (python -c puts the cwd first on sys.path, ahead of
    # PYTHONPATH: run from here it would write this checkout's models whatever --trtspec-root says).
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=1800, cwd=root
    )
    if out.returncode != 0:
        sys.exit(f"writing the repository failed:\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", choices=["example", "tiny"], default="example")
    ap.add_argument("--orchestration", choices=["default", "in_process", "bls"], default="default")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--malformed", type=float, default=0.1)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take before it is a hang")
    ap.add_argument("--time-limit", type=float, default=1800.0)
    ap.add_argument("--trtspec-root", type=Path, help="serve this checkout of trtspec instead of this one")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from trtspec.serving import soak
    from trtspec.serving.server import TritonServer

    console = Console()
    console.print(
        f"load: {os.getloadavg()[0]:.2f} (1 min), pair {args.pair}, orchestration {args.orchestration}, "
        f"{args.requests} requests at concurrency {args.concurrency}, {args.malformed:.0%} malformed, "
        f"code: {args.trtspec_root or ROOT}"
    )
    root = Path(tempfile.mkdtemp(prefix="trtspec-soak-"))
    repo = _write_repo(root, args.pair, args.orchestration, args.trtspec_root, args.max_seq_len)
    env = {"TRTSPEC_PYTHONPATH": str(args.trtspec_root)} if args.trtspec_root else {}
    with TritonServer(repo, log_file=root / "server.log", env=env) as server:
        refs = soak.reference_texts(server.grpc_url, PROMPTS, args.max_tokens, timeout_s=args.timeout)
        requests = soak.plan_requests(
            PROMPTS, args.requests, args.malformed, args.max_tokens, long_prompt=soak.long_prompt(args.max_seq_len)
        )
        t0 = time.time()
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("soak", total=len(requests))
            result = soak.run_soak(
                server.grpc_url,
                server.pid,
                server.metrics_url,
                requests,
                args.concurrency,
                refs,
                timeout_s=args.timeout,
                time_limit_s=args.time_limit,
                progress=lambda done, total: bar.update(task, completed=done),
            )
        ready = server.is_ready()
    summary = {
        **result.summary(),
        "server_ready_after": ready,
        "started": t0,
        "load_1min_after": round(os.getloadavg()[0], 2),
    }
    table = Table(title=f"soak: {args.pair}, {args.orchestration}, c={args.concurrency}")
    for key in (
        "requests",
        "completed",
        "dead_stubs",
        "segfaults",
        "errors_on_good",
        "wrong_texts",
        "hangs",
        "malformed_accepted",
        "backend_failures",
        "tokens_per_s",
        "wall_s",
        "server_ready_after",
    ):
        table.add_row(key, str(summary[key]))
    console.print(table)
    if result.dead_stubs:
        console.print(f"dead stubs: {', '.join(result.dead_stubs)}")
    if result.errors_on_good:
        console.print(f"first errors: {result.errors_on_good[:3]}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
