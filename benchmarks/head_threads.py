"""The vocabulary head on every thread or on the calling one, side by side in one process.

Under a passive OpenMP wait trtspec's bfloat16 kernels run a call of fewer than 8 rows on the calling thread (waking
the sleeping one costs more than a layer's multiply gains), except a multiply whose weight has
``cpu_kernels.PARALLEL_ELEMENTS`` elements or more: the vocabulary head, which streams tens of megabytes. This
decodes the workload conversations (``trtspec/data/workloads.jsonl``, 96 tokens, greedy, the example in bfloat16)
with each decoder twice per prompt, once with the head on one thread ("one", the threshold out of reach) and once on
every thread ("all", the shipped threshold), the order alternating from prompt to prompt, and prints tokens per
second for each and their ratio; greedy output must be the same (the kernel's sums do not depend on the threads).

    python benchmarks/head_threads.py [--repeats 1] [--max-tokens 96] [--json F]

About 2.5 minutes a repeat on a quiet 2-core machine (note ``uptime``). Needs a CPU where trtspec's kernels build.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trtspec.threads import set_wait_policy  # noqa: E402

set_wait_policy()  # before torch loads: OpenMP waits passively, as in every process trtspec runs torch in

import torch  # noqa: E402

from trtspec.prompts import encode_messages, workloads  # noqa: E402
from trtspec.runtimes.inflight import cpu_kernels  # noqa: E402
from trtspec.runtimes.torch.decoder import SpeculativeDecoder  # noqa: E402
from trtspec.speculative.drafters.ngram import POOL_FILE, NgramPool  # noqa: E402

SHIPPED = cpu_kernels.PARALLEL_ELEMENTS
NEVER = 1 << 62


def run(repeats: int, max_tokens: int) -> dict:
    from trtspec.example import example_models
    from trtspec.runtimes.torch.session import TorchSession

    if not cpu_kernels.available():
        raise SystemExit("trtspec's CPU kernels do not build here: nothing to compare")
    paths = example_models()
    session = TorchSession(paths.target, paths.draft, dtype="bfloat16", max_draft_len=4)
    pool = NgramPool.load(Path(paths.draft) / POOL_FILE)
    eos = list(session.decoder.eos_ids)
    decoders = {
        "target-only": SpeculativeDecoder(session.target, None, eos_ids=eos),
        "ngram:4": SpeculativeDecoder(
            session.target, None, max_draft_len=4, eos_ids=eos, drafter="ngram", ngram_pool=pool
        ),
        "model:4": SpeculativeDecoder(session.target, session.draft, max_draft_len=4, eos_ids=eos, drafter="model"),
    }
    prompts = [encode_messages(session.tokenizer, m) for convs in workloads().values() for m in convs]
    for dec in decoders.values():
        dec.generate([prompts[0][:32]], 8)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    tokens: Counter = Counter()
    answers: dict[tuple[str, int], list[int]] = {}
    same = True
    try:
        for r in range(repeats):
            for i, ids in enumerate(prompts):
                for name, dec in decoders.items():
                    for arm in ("all", "one") if (i + r) % 2 else ("one", "all"):
                        cpu_kernels.PARALLEL_ELEMENTS = SHIPPED if arm == "all" else NEVER
                        t0 = time.perf_counter()
                        res = dec.generate([ids], max_tokens)[0]
                        seconds[name, arm] += time.perf_counter() - t0
                        tokens[name, arm] += len(res.token_ids)
                        same &= answers.setdefault((name, i), res.token_ids) == res.token_ids
    finally:
        cpu_kernels.PARALLEL_ELEMENTS = SHIPPED
    rows = {
        name: {
            "one_tok_s": round(tokens[name, "one"] / seconds[name, "one"], 2),
            "all_tok_s": round(tokens[name, "all"] / seconds[name, "all"], 2),
            "all_over_one": round(
                (tokens[name, "all"] / seconds[name, "all"]) / (tokens[name, "one"] / seconds[name, "one"]), 4
            ),
        }
        for name in decoders
    }
    threads = torch.get_num_threads()
    return {"rows": rows, "greedy_identical": same, "repeats": repeats, "prompts": len(prompts), "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args.repeats, args.max_tokens)
    from rich.console import Console
    from rich.table import Table

    table = Table(title="the vocabulary head on one thread or on every thread (tok/s, in process)")
    for col in ("decoder", "head on one thread", "head on every thread", "ratio"):
        table.add_column(col, justify="left" if col == "decoder" else "right")
    for name, row in result["rows"].items():
        table.add_row(name, f"{row['one_tok_s']:.2f}", f"{row['all_tok_s']:.2f}", f"{row['all_over_one']:.3f}x")
    Console(width=120).print(table)
    print(f"greedy output identical: {result['greedy_identical']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if not result["greedy_identical"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
