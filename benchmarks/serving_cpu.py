"""Serving on a CPU through a real Triton server: orchestrations side by side in one run, same prompts, same machine.

    python benchmarks/serving_cpu.py [--pair example|self] [--max-tokens 48] [--levels 1,8] [--requests 16] [--rounds 1]
        [--orchestrations in_process,bls] [--drafters adaptive,model,ngram,hybrid] [--old-root DIR] [--json out.json]

For each served repository, in turn (one server at a time): output tok/s at each concurrency level, with the draft
and target-only (num_draft_tokens 0), streamed gRPC requests through the ensemble, and the acceptance rate. With
``--rounds`` R, the two modes alternate R times per level and are pooled; the speedup comes with a 95 % interval over
the rounds' pairs (benchmarks/paired.py).
Repositories: the torch runtime's in-process draft-target model (orchestration in_process, the default), the BLS
orchestrator over two torch engine models (orchestration bls: the path runtime trtllm-engine takes), and, with
``--old-root`` (a checkout of an older trtspec, e.g. ``git worktree add ../old db558e7``), that checkout's repository
served by that checkout's code, with the first of ``--orchestrations`` and of ``--drafters``. Then Triton's
overhead at concurrency 1: the in-process model through Triton against the same engine in this process
(``trtspec generate``'s decoder), same prompts and settings.

``--drafters`` serves each orchestration once per drafter (``speculative.drafter``: adaptive, the draft model,
n-grams from prompt lookup and the example's pool, or the hybrid), so that the drafters are compared through Triton
side by side.

``--pair self`` serves the target as its own draft (acceptance 1): the orchestration overhead with every draft
accepted. The default is the embedded example (SmolLM2-135M-Instruct and its distilled draft).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The same OpenMP setting as the server's model processes (trtspec.serving.server.server_environment), so that the
# in-process baseline is not penalized by spinning threads on a shared machine; must precede importing torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # paired.py, next to this script

from paired import paired_ratio  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Explain why the sky is blue in two sentences.",
    "Give me three tips for learning a new language.",
    "What is speculative decoding?",
    "Describe a cat in one paragraph.",
    "List the planets of the solar system.",
    "How does a refrigerator work?",
]

WRITE = """
import sys
from pathlib import Path
from trtspec.example import example_models, example_spec_dict
from trtspec.spec import spec_from_dict
from trtspec.pipeline import write_repo
root, pair, orchestration = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
paths = example_models()
data = example_spec_dict(paths.target, paths.target if pair == "self" else paths.draft)
if len(sys.argv) > 4:  # an older checkout's spec may not know the field: its default is the model drafter
    data.setdefault("speculative", {})["drafter"] = sys.argv[4]
data["triton"] = {"orchestrator_instances": 1}
if orchestration != "default":
    data["triton"]["orchestration"] = orchestration
spec = spec_from_dict(data, base_dir=root, environ={})
write_repo(spec, force=True)
print(spec.repo_dir, spec.speculative.max_draft_len)
"""


def write_repo(
    root: Path, pair: str, orchestration: str, trtspec_root: Path | None, drafter: str = "model"
) -> tuple[Path, int]:
    """A repository written by the given checkout of trtspec (this one by default), in a child process."""
    env = dict(os.environ, PYTHONPATH=str(trtspec_root or ROOT))
    # cwd=root: python -c puts the cwd first on sys.path, ahead of PYTHONPATH (run from a checkout, it would win).
    root.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, "-c", WRITE, str(root), pair, orchestration]
        + ([drafter] if drafter != "model" or trtspec_root is None else []),
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        cwd=root,
    )
    if out.returncode != 0:
        sys.exit(f"writing the {orchestration} repository failed:\n{out.stderr[-3000:]}")
    repo, k = out.stdout.split()[-2:]
    return Path(repo), int(k)


def measure(
    url: str, prompts: list[str], concurrency: int, n_requests: int, max_tokens: int, target_only: bool
) -> dict:
    from trtspec.serving import soak

    options = (("apply_chat_template", True),) + ((("num_draft_tokens", 0),) if target_only else ())
    requests = [
        soak.SoakRequest("good", prompts[i % len(prompts)], max_tokens, True, options) for i in range(n_requests)
    ]
    r = soak.run_soak(url, 0, "", requests, concurrency, {}, timeout_s=600)
    return {
        "tok_s": round(r.tokens_per_s, 2),
        "acceptance": round(r.acceptance_rate, 3),
        "errors": len(r.errors_on_good) + r.hangs,
        "tokens": r.output_tokens,
    }


def pooled(runs: list[dict]) -> dict:
    """Runs of ``measure`` as one: tokens over the seconds of all of them, acceptance weighted by tokens."""
    tokens = sum(r["tokens"] for r in runs)
    seconds = sum(r["tokens"] / r["tok_s"] for r in runs if r["tok_s"])
    return {
        "tok_s": round(tokens / seconds, 2) if seconds else 0.0,
        "acceptance": round(sum(r["acceptance"] * r["tokens"] for r in runs) / tokens, 3) if tokens else 0.0,
        "errors": sum(r["errors"] for r in runs),
        "tokens": tokens,
        "runs": [r["tok_s"] for r in runs],
    }


def session_c1(session, prompts, max_tokens, use_draft):
    t0 = time.perf_counter()
    tokens = 0
    for p in prompts:
        r = session.generate(p, max_tokens, chat=True, use_draft=use_draft)
        tokens += len([t for t in r.token_ids if t not in session.decoder.eos_ids])
    return tokens / (time.perf_counter() - t0)


def in_process_session(pair: str, k: int, drafter: str):
    """The decoder a served in-process model runs, in this process: the same models, dtype, K and drafter."""
    from trtspec.example import example_models
    from trtspec.runtimes.torch.session import TorchSession
    from trtspec.spec_defaults import cpu_dtype
    from trtspec.speculative.drafters.ngram import POOL_FILE, NgramPool

    paths = example_models()
    pool_file = Path(paths.draft) / POOL_FILE
    # The served models' dtype (the example's on this CPU: bfloat16 where it has native bfloat16). The session's own
    # default is float32, which made the in-process side the slower one on such CPUs.
    session = TorchSession(
        paths.target,
        paths.target if pair == "self" else paths.draft,
        dtype=cpu_dtype(),
        max_draft_len=k,
        drafter=drafter,
        ngram_pool=NgramPool.load(pool_file) if pool_file.is_file() and drafter != "model" else None,
    )
    from trtspec.runtimes.torch.costs import fastest_threads

    fastest_threads(session.target)  # the thread count the served model times and takes (trtspec.threads)
    return session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--pair", choices=["example", "self"], default="example")
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--requests", type=int, default=16, help="requests per level and mode")
    ap.add_argument("--repeats", type=int, default=3, help="concurrency-1 overhead runs")
    ap.add_argument(
        "--rounds", type=int, default=1, help="speculative and target-only runs per level, alternated, pooled"
    )
    ap.add_argument("--orchestrations", default="in_process,bls", help="of in_process, bls")
    ap.add_argument("--drafters", default="adaptive", help="of adaptive, model, ngram, hybrid (speculative.drafter)")
    ap.add_argument("--old-root", type=Path, help="a checkout of an older trtspec to serve side by side")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from trtspec.serving.server import TritonServer

    console = Console(width=max(120, shutil.get_terminal_size().columns))  # the table is wide
    levels = [int(x) for x in args.levels.split(",")]
    console.print(
        f"load {os.getloadavg()[0]:.2f}; pair {args.pair}; max_tokens {args.max_tokens}; "
        f"{args.requests} requests per level; levels {levels}"
    )
    root = Path(tempfile.mkdtemp(prefix="trtspec-bench-"))
    drafters = args.drafters.split(",")
    configs = [
        (o if d == "model" else f"{o} {d}", o, None, d) for d in drafters for o in args.orchestrations.split(",")
    ]
    if args.old_root:
        # the same orchestration and drafter as the first served here (once "old BLS" over the old checkout's
        # default orchestration and the model drafter, whatever this run served)
        orchestration, drafter = args.orchestrations.split(",")[0], drafters[0]
        old = f"old {orchestration}" + ("" if drafter == "model" else f" {drafter}")
        configs.append((f"{old} ({args.old_root.name})", orchestration, args.old_root.resolve(), drafter))
    results: dict = {"pair": args.pair, "max_tokens": args.max_tokens, "levels": levels, "servers": {}}
    c1_triton: list[float] = []
    in_proc: list[float] = []
    overhead_of = None  # the first in-process model served: Triton's overhead over it
    for name, orchestration, code, drafter in configs:
        slug = name.split(" (")[0].replace(" ", "-")
        repo, k = write_repo(root / slug, args.pair, orchestration, code, drafter)
        env = {"TRTSPEC_PYTHONPATH": str(code)} if code else {}
        with TritonServer(repo, log_file=root / f"{slug}.log", env=env) as server:
            measure(server.grpc_url, QUESTIONS[:2], 1, 2, 8, False)  # warm up both paths
            measure(server.grpc_url, QUESTIONS[:2], 1, 2, 8, True)
            rows = {}
            for c in levels:
                console.print(f"{name}: concurrency {c}")
                # A first run of each mode at this level, not pooled: the adaptive policy meets a new batch size
                # here (its costs are calibrated at start, its acceptance learned as it serves), and whichever mode
                # ran first at a level paid for it (the first speculative run at concurrency 8 read 0.79-1.03x the
                # target-only run after it in six server starts, median 0.90x; the later ones 0.97-1.05x).
                # Reported as "first".
                first = {
                    to: measure(server.grpc_url, QUESTIONS, c, args.requests, args.max_tokens, to)
                    for to in (False, True)
                }
                runs: dict[bool, list[dict]] = {False: [], True: []}
                for r in range(args.rounds):  # alternated, so that both modes meet the same drift of the machine
                    for target_only in (False, True) if r % 2 == 0 else (True, False):
                        runs[target_only].append(
                            measure(server.grpc_url, QUESTIONS, c, args.requests, args.max_tokens, target_only)
                        )
                spec_r, base_r = pooled(runs[False]), pooled(runs[True])
                pairs = [(b, sp) for b, sp in zip(runs[True], runs[False]) if b["tok_s"] and sp["tok_s"]]
                rows[c] = {
                    "speculative": spec_r,
                    "target_only": base_r,
                    "speedup": round(spec_r["tok_s"] / base_r["tok_s"], 3) if base_r["tok_s"] else None,
                    # round r's two runs ran back to back: the interval resamples those pairs (benchmarks/paired.py)
                    "speedup_interval": paired_ratio(
                        [b["tokens"] / b["tok_s"] for b, _ in pairs],
                        [sp["tokens"] / sp["tok_s"] for _, sp in pairs],
                        [b["tokens"] for b, _ in pairs],
                        [sp["tokens"] for _, sp in pairs],
                    )
                    if len(pairs) >= 2
                    else None,
                    "first": {"speculative": first[False], "target_only": first[True]},
                    "first_speedup": round(first[False]["tok_s"] / first[True]["tok_s"], 3)
                    if first[True]["tok_s"]
                    else None,
                }
            if orchestration == "in_process" and overhead_of in (None, name):
                # Triton's overhead: this server against the same decoder and drafter in this process, run by run in
                # turn while the server idles (measured one after the other, the two sides met different states of
                # a shared machine whose speed drifts by 20-50 %: the in-process side once read 46 % slower).
                overhead_of = name
                session = in_process_session(args.pair, k, drafter)
                # Warm-up, and what the server's policy had learned by now (it served every level before): the same
                # questions once, so that the adaptive policy here is not measured while it learns its costs.
                session_c1(session, QUESTIONS[:1], 8, True)
                session_c1(session, QUESTIONS[:4], args.max_tokens, True)
                for _ in range(args.repeats):
                    c1_triton.append(measure(server.grpc_url, QUESTIONS[:4], 1, 4, args.max_tokens, False)["tok_s"])
                    in_proc.append(session_c1(session, QUESTIONS[:4], args.max_tokens, True))
                del session
        results["servers"][name] = {"k": k, "levels": rows}

    if c1_triton:
        from trtspec.spec_defaults import cpu_dtype

        ratios = [t / i for t, i in zip(c1_triton, in_proc)]  # each pair measured back to back
        results["overhead_c1"] = {
            "triton_in_process_model_tok_s": c1_triton,
            "in_process_decoder_tok_s": in_proc,
            "server": overhead_of,
            "overhead": round(1 - statistics.median(ratios), 3),
            "overhead_per_pair": [round(1 - r, 3) for r in ratios],
            "dtype": cpu_dtype(),
        }

    t = Table(
        title=f"output tok/s through Triton ({args.pair}, max_tokens {args.max_tokens}, load {os.getloadavg()[0]:.2f})"
    )
    columns = ("server", "conc.", "speculative", "target-only", "speedup", "95 % (pairs)", "first run", "acceptance")
    for col in (*columns, "errors"):
        t.add_column(col, justify="right")
    for name, r in results["servers"].items():
        for c, row in r["levels"].items():
            ci = row["speedup_interval"]
            t.add_row(
                name,
                str(c),
                f"{row['speculative']['tok_s']:.1f}",
                f"{row['target_only']['tok_s']:.1f}",
                f"{row['speedup']:.2f}x" if row["speedup"] else "-",
                f"{ci['lo']:.2f}-{ci['hi']:.2f} ({ci['pairs']})" if ci else "-",
                f"{row['first_speedup']:.2f}x" if row["first_speedup"] else "-",
                f"{row['speculative']['acceptance']:.2f}",
                str(row["speculative"]["errors"] + row["target_only"]["errors"]),
            )
    console.print(t)
    if c1_triton:
        o = results["overhead_c1"]
        console.print(
            f"concurrency 1, speculative ({o['server']}): Triton median {statistics.median(c1_triton):.1f} "
            f"tok/s vs in process {statistics.median(in_proc):.1f} tok/s, run by run in turn: overhead "
            f"{o['overhead']:.1%} (median of the pairs {', '.join(f'{x:.1%}' for x in o['overhead_per_pair'])})"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
