"""c and v as functions of the batch on this machine: the example's target and draft, through the engine's own passes.

Per batch size b (sequences of ``--context`` cached tokens each): a plain step (one token per sequence, the head on
every row) in ms; v[K] = the step in which every sequence verifies K + 1 tokens / the plain step; c = one draft round
of b rows / the plain step (trtspec.runtimes.torch.costs.batch_step_costs). What the adaptive policy learns online
per number of sequences (trtspec.speculative.adaptive.BatchPassCosts), measured here in one go:

    python benchmarks/batch_costs.py [--dtype float32|bfloat16] [--context 200] [--batches 1,2,4,8] [--json F]

About a minute on 2 cores. Run it under the CPU lock on a quiet machine and note ``uptime``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.threads import set_wait_policy  # noqa: E402

set_wait_policy()  # before torch loads, as in every trtspec process


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=None, help="default: the example's on this CPU")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--ks", default="1,2,4")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from trtspec.example import example_models
    from trtspec.runtimes.torch.costs import batch_step_costs
    from trtspec.runtimes.torch.session import TorchSession
    from trtspec.spec_defaults import cpu_dtype

    dtype = args.dtype or cpu_dtype()
    paths = example_models()
    session = TorchSession(paths.target, paths.draft, dtype=dtype)
    batches = tuple(int(x) for x in args.batches.split(","))
    ks = tuple(int(x) for x in args.ks.split(","))
    rows = batch_step_costs(session.target, session.draft, args.context, batches, ks, reps=args.reps)
    table = Table(title=f"c and v by batch ({dtype}, {args.context} cached tokens per sequence)")
    for col in ["sequences", "plain step ms", *[f"v K{k}" for k in ks], "c"]:
        table.add_column(col, justify="right")
    for b, r in rows.items():
        table.add_row(str(b), f"{1000 * r['step_s']:.1f}", *[f"{r['v'][k]:.2f}" for k in ks], f"{r['c']:.3f}")
    Console(width=100).print(table)
    if args.json:
        args.json.write_text(json.dumps({"dtype": dtype, "context": args.context, "batches": rows}, indent=1))


if __name__ == "__main__":
    main()
