"""The torch runtime's decode step on a CPU, old path against new, side by side in one run on the same prompts.

The embedded example (SmolLM2-135M fp32 target, its distilled draft and n-gram pool), greedy, in process through the
in-flight engine: ms/token and tok/s target-only and speculative (n-gram drafter and draft model, K 4) with the
transformers module tree (``fast_step=False``, the path before the fused step) and with the fused Llama step
(trtspec.runtimes.inflight.llama_step), with ``--onednn`` the fused step with trtspec's few-row float32 kernel
(trtspec.runtimes.inflight.cpu_kernels) turned off, and with ``--bf16`` the fused step on the same weights in bfloat16
(another target: its own greedy text, which its speculative runs must equal; trtspec's bfloat16 multiply, and with
``--onednn`` also without it); the cost ratios v (verify K + 1 tokens
/ one decode step, with the head at the measured tokens per step) and c (draft step / target step) through each path
(trtspec.runtimes.torch.costs); and whether every path's text equals its own target-only text. Methods alternate
prompt by prompt, so background load hits them alike. Run it under the CPU lock on a quiet machine, note ``uptime``:

    OMP_WAIT_POLICY=PASSIVE python benchmarks/cpu_runtime.py [--max-tokens 64] [--k 4] [--threads 0] [--bf16]
        [--onednn] [--json out.json]

(about 4 minutes on 2 cores, 6 with --bf16.) The OpenMP wait policy is read when torch loads: this script defaults it
to passive as trtspec does (trtspec.threads) unless the environment sets it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.threads import set_wait_policy  # noqa: E402

set_wait_policy()  # before torch loads

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from trtspec.runtimes.inflight.llama_step import step_of  # noqa: E402
from trtspec.runtimes.torch.costs import step_cost_ratios  # noqa: E402
from trtspec.runtimes.torch.decoder import SpeculativeDecoder  # noqa: E402
from trtspec.runtimes.torch.session import TorchSession  # noqa: E402
from trtspec.speculative.drafters.ngram import POOL_FILE, NgramPool  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Explain why the sky is blue in two sentences.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
]
MODES = ("target-only", "ngram", "draft model")
# (name, fused step); "new oneDNN" / "new bf16 oneDNN": the fused float32 / bfloat16 step with trtspec's multiply
# kernels off (the paths before them: oneDNN's packed weights, split reductions for bfloat16)
PATHS = (("old", False), ("new oneDNN", True), ("new", True), ("new bf16 oneDNN", True), ("new bf16", True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core)")
    ap.add_argument("--context", type=int, default=256, help="cached tokens before the timed passes of v and c")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--bf16", action="store_true", help="also the fused step on bfloat16 weights")
    ap.add_argument(
        "--onednn", action="store_true", help="also the fused float32 step on oneDNN's kernels (trtspec's kernel off)"
    )
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from trtspec.example import example_models

    paths = example_models()
    session = TorchSession(paths.target, paths.draft)
    sessions = {"old": session, "new": session}
    if args.bf16:  # the same weights in bfloat16 through the fused step (its row-invariant path)
        sessions["new bf16"] = TorchSession(paths.target, paths.draft, dtype="bfloat16")
    if args.onednn:  # the same weights, their fused steps built with trtspec's multiply kernels turned off
        sessions["new oneDNN"] = TorchSession(paths.target, paths.draft)
        if args.bf16:
            sessions["new bf16 oneDNN"] = TorchSession(paths.target, paths.draft, dtype="bfloat16")
        os.environ["TRTSPEC_CPU_KERNELS"] = "0"
        try:
            for name in ("new oneDNN", "new bf16 oneDNN"):
                if name in sessions:
                    step_of(sessions[name].target)
                    step_of(sessions[name].draft)
        finally:
            del os.environ["TRTSPEC_CPU_KERNELS"]
    prompts = [session.encode(q) for q in QUESTIONS]
    eos = list(session.decoder.eos_ids)
    pool = NgramPool.load(Path(paths.draft) / POOL_FILE)
    decoders = {}
    for path, fast in PATHS:
        if path not in sessions:
            continue
        for mode in MODES:
            drafter = "ngram" if mode == "ngram" else "model"
            decoders[(path, mode)] = SpeculativeDecoder(
                sessions[path].target,
                sessions[path].draft,
                max_draft_len=args.k,
                eos_ids=eos,
                drafter=drafter,
                ngram_pool=pool,
                fast_step=fast,
            )

    def run(key, prompt, n):
        dec = decoders[key]
        return dec.generate([prompt], n, use_draft=key[1] != "target-only")[0]

    for key in decoders:  # warm-up: first calls allocate the caches
        run(key, prompts[0], 8)
    seconds = dict.fromkeys(decoders, 0.0)
    tokens = dict.fromkeys(decoders, 0)
    steps = dict.fromkeys(decoders, 0)
    texts: dict = {key: [] for key in decoders}
    for prompt in prompts:
        for key in decoders:
            t0 = time.perf_counter()
            r = run(key, prompt, args.max_tokens)
            seconds[key] += time.perf_counter() - t0
            tokens[key] += len(r.token_ids)
            steps[key] += r.stats.target_steps
            texts[key].append(r.token_ids)
    tps = {key: tokens[key] / max(1, steps[key]) for key in decoders}
    costs = {}
    for path, fast in PATHS:
        if path in sessions:
            s = sessions[path]
            costs[path] = step_cost_ratios(
                s.target, s.draft, args.context, args.k, tps[(path, "draft model")], fast_step=fast
            )

    rows = []
    for key in decoders:
        ms = 1000 * seconds[key] / tokens[key]
        rows.append(
            {
                "path": key[0],
                "mode": key[1],
                "ms_per_token": round(ms, 2),
                "tok_per_s": round(1000 / ms, 2),
                "tokens_per_step": round(tps[key], 3),
                # each path against its own target-only text (bfloat16 is another target: its own greedy text)
                "identical_to_own_target_only": texts[key] == texts[(key[0], "target-only")],
            }
        )
    table = Table(title=f"torch runtime, in process, K {args.k}, {args.max_tokens} tokens x {len(prompts)} prompts")
    for col in (
        "path",
        "mode",
        "ms/token",
        "tok/s",
        "tokens/step",
        "old/this",
        "speedup",
        "same text as its target-only",
    ):
        table.add_column(col)
    for row in rows:
        old = next(r for r in rows if r["path"] == "old" and r["mode"] == row["mode"])
        ratio = old["ms_per_token"] / row["ms_per_token"]
        own = next(r for r in rows if r["path"] == row["path"] and r["mode"] == "target-only")
        row["speedup_over_own_target_only"] = round(own["ms_per_token"] / row["ms_per_token"], 3)
        table.add_row(
            row["path"],
            row["mode"],
            f"{row['ms_per_token']:.1f}",
            f"{row['tok_per_s']:.1f}",
            f"{row['tokens_per_step']:.2f}",
            f"{ratio:.2f}x",
            f"{row['speedup_over_own_target_only']:.2f}x",
            "yes" if row["identical_to_own_target_only"] else "NO",
        )
    console = Console(width=max(120, shutil.get_terminal_size().columns))  # readable in a log, not folded at 80
    console.print(table)
    ct = Table(title=f"cost ratios after {args.context} cached tokens (v at the draft model's tokens/step)")
    for col in ("path", "c (draft step / target step)", f"v (verify {args.k + 1} / one step)"):
        ct.add_column(col)
    for path, (c, v) in costs.items():
        ct.add_row(path, f"{c:.3f}", f"{v:.3f}")
    console.print(ct)
    load = os.getloadavg()[0]
    console.print(
        f"torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
        f"load average (1 min) {load:.2f}"
    )
    if args.json is not None:
        out = {"rows": rows, "costs": {p: {"c": c, "v": v} for p, (c, v) in costs.items()}, "load": load}
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
