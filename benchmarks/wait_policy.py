"""OpenMP's wait between parallel regions, measured: trtspec's decode with each policy, idle and beside CPU burners.

A decode step of the fused CPU step runs about 120 multiplies and 90 other kernels, each an OpenMP parallel region.
Under ``OMP_WAIT_POLICY=PASSIVE`` the other thread sleeps after every region and must be woken for the next (on a VM
a sleeping vCPU's wake-up goes through the hypervisor); GNU OpenMP's default spins 300,000 iterations, which takes
the core from whatever else needs it. ``GOMP_SPINCOUNT`` sets the spin between the two. Each policy runs in its own
process (OpenMP reads it when torch loads), the example target in the dtype trtspec chooses for this CPU, greedy,
target-only and n-gram K 4, the policies alternating round by round, first on an idle machine, then beside
``--burners`` busy processes:

    python benchmarks/wait_policy.py [--rounds 2] [--max-tokens 48] [--burners 2] [--json out.json]

(about 4 minutes on 2 cores.) Run it on a quiet machine and note ``uptime``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "passive, spin 10k": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"},
    "passive, spin 100k": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "100000"},
    "OpenMP default": {},
}
QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
]

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from trtspec.example import example_models
from trtspec.runtimes.torch.decoder import SpeculativeDecoder
from trtspec.runtimes.torch.session import TorchSession
from trtspec.spec_defaults import cpu_dtype
from trtspec.speculative.drafters.ngram import POOL_FILE, NgramPool
from pathlib import Path
n, questions = int(sys.argv[2]), json.loads(sys.argv[3])
paths = example_models()
s = TorchSession(paths.target, paths.draft, dtype=cpu_dtype())
pool = NgramPool.load(Path(paths.draft) / POOL_FILE)
dec = SpeculativeDecoder(s.target, None, max_draft_len=4, eos_ids=[], drafter="ngram", ngram_pool=pool)
prompts = [s.encode(q) for q in questions]
dec.generate([prompts[0]], 8, use_draft=False)
out = {}
for mode in ("target-only", "ngram K4"):
    seconds = tokens = 0
    for p in prompts:
        t = time.perf_counter()
        r = dec.generate([p], n, use_draft=mode != "target-only")[0]
        seconds += time.perf_counter() - t
        tokens += len(r.token_ids)
    out[mode] = 1000 * seconds / tokens
print(json.dumps(out))
"""


def _burn(stop: mp.Event) -> None:  # type: ignore[valid-type]
    x = 0
    while not stop.is_set():  # type: ignore[attr-defined]
        for i in range(100000):
            x ^= i


def _child(policy: dict[str, str], n: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(policy)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), str(n), json.dumps(QUESTIONS)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    load_before = os.getloadavg()[0]
    for machine in ("idle", f"{args.burners} burners"):
        stop = mp.Event()
        burners = [
            mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.burners if machine != "idle" else 0)
        ]
        for b in burners:
            b.start()
        try:
            for _ in range(args.rounds):
                for name, policy in POLICIES.items():
                    got = _child(policy, args.max_tokens)
                    for mode, ms in got.items():
                        results.setdefault(machine, {}).setdefault(name, {}).setdefault(mode, []).append(ms)
        finally:
            stop.set()
            for b in burners:
                b.join(timeout=5)
        time.sleep(2)
    table = Table(title=f"ms/token (median of {args.rounds} rounds), example target, {args.max_tokens} tokens x 3")
    table.add_column("policy")
    for machine in results:
        for mode in ("target-only", "ngram K4"):
            table.add_column(f"{machine}: {mode}")
    for name in POLICIES:
        row = [name]
        for machine in results:
            for mode in ("target-only", "ngram K4"):
                row.append(f"{statistics.median(results[machine][name][mode]):.1f}")
        table.add_row(*row)
    Console(width=max(120, shutil.get_terminal_size().columns)).print(table)
    print(f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({"results": results, "load_before": load_before}, indent=2))


if __name__ == "__main__":
    main()
