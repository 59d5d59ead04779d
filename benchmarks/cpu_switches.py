"""A switch of trtspec's CPU runtime off and on, side by side in one process.

Each switch is one choice of the fast CPU step, compared on the same decoders and prompts:

- ``head-threads``: under a passive OpenMP wait trtspec's bfloat16 kernels run a call of fewer than 8 rows on the
  calling thread (waking the sleeping one costs more than a layer's multiply gains), except a multiply whose weight
  has ``cpu_kernels.PARALLEL_ELEMENTS`` elements or more: the vocabulary head, which streams tens of megabytes. Off:
  the head on one thread (the threshold out of reach); on: on every thread (the shipped threshold).
- ``whole-pass``: a pass of the fused Llama step through every layer in one C call (``cpu_kernels.whole_pass``;
  ``LlamaStep.whole_pass``; bfloat16 every pass, float32 passes of at most ``cpu_kernels.MAX_ROWS`` tokens). Off:
  the same kernels called one by one from Python, 9 a layer; on: the shipped path.
- ``one-region``: the whole pass's threads. Off: each kernel call in its own OpenMP region with its own thread count
  (under a passive wait one thread for calls of fewer than 8 rows, ``cpu_kernels.threads_for``); on: one region of
  all of torch's threads for the whole pass, each step dealt between them, a spinning barrier between steps
  (``LlamaStep.one_region``, ``cpu_kernels.pass_team``).
- ``argmax``: a greedy step's tokens from the head's logits. Off: torch's argmax over a float32 copy; on: trtspec's
  kernel, in place (``cpu_kernels.argmax``).

It decodes the workload conversations (``trtspec/data/workloads.jsonl``, 96 tokens, greedy, the example in bfloat16,
or ``--dtype``) with each decoder (target-only, n-grams K 4, the draft model K 4) twice per prompt, off and on, the
order alternating from prompt to prompt, and prints tokens per second for each and their ratio; greedy output must
be the same (neither switch changes a bit).

    python benchmarks/cpu_switches.py {head-threads,whole-pass,one-region,argmax} [--repeats 1] [--max-tokens 96] \
        [--dtype bfloat16|float32] [--json F]

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
from trtspec.runtimes.inflight.llama_step import step_of  # noqa: E402
from trtspec.runtimes.torch.decoder import SpeculativeDecoder  # noqa: E402
from trtspec.speculative.drafters.ngram import POOL_FILE, NgramPool  # noqa: E402

SHIPPED = cpu_kernels.PARALLEL_ELEMENTS
NEVER = 1 << 62
SWITCHES = {
    "head-threads": ("the vocabulary head on one thread or on every thread", "head on one thread", "on every thread"),
    "whole-pass": ("the layers' kernels called one by one from Python or in one C call", "one by one", "one call"),
    "one-region": ("each kernel in its own OpenMP region or the whole pass in one", "a region a kernel", "one region"),
    "argmax": ("a greedy step's argmax by torch (float32 copy) or by the kernel in place", "torch", "kernel"),
}


def _switch(name: str, on: bool, steps: list, decoders: dict) -> None:
    """Set switch ``name`` off or on (on: as shipped) in this process; ``steps``: the models' fused steps."""
    if name == "head-threads":
        cpu_kernels.PARALLEL_ELEMENTS = SHIPPED if on else NEVER
    elif name == "whole-pass":
        for step in steps:
            step.whole_pass = on
    elif name == "one-region":
        for step in steps:
            step.one_region = on
    else:
        for dec in decoders.values():
            for engine in dec._engines.values():
                engine._argmax = cpu_kernels.argmax if on else None


def run(switch: str, repeats: int, max_tokens: int, dtype: str = "bfloat16") -> dict:
    from trtspec.example import example_models
    from trtspec.runtimes.torch.session import TorchSession

    if not cpu_kernels.available():
        raise SystemExit("trtspec's CPU kernels do not build here: nothing to compare")
    paths = example_models()
    session = TorchSession(paths.target, paths.draft, dtype=dtype, max_draft_len=4)
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
    # the fused steps the decoders run (step_of gives the one each model keeps)
    steps = [step_of(m) for m in (session.target, session.draft)]
    if switch in ("whole-pass", "one-region") and not all(step is not None and step.whole_pass for step in steps):
        raise SystemExit("the whole pass does not run here: nothing to compare")
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    tokens: Counter = Counter()
    answers: dict[tuple[str, int], list[int]] = {}
    same = True
    try:
        for r in range(repeats):
            for i, ids in enumerate(prompts):
                for name, dec in decoders.items():
                    for arm in ("on", "off") if (i + r) % 2 else ("off", "on"):
                        _switch(switch, arm == "on", steps, decoders)
                        t0 = time.perf_counter()
                        res = dec.generate([ids], max_tokens)[0]
                        seconds[name, arm] += time.perf_counter() - t0
                        tokens[name, arm] += len(res.token_ids)
                        same &= answers.setdefault((name, i), res.token_ids) == res.token_ids
    finally:
        _switch(switch, True, steps, decoders)
    rows = {
        name: {
            "off_tok_s": round(tokens[name, "off"] / seconds[name, "off"], 2),
            "on_tok_s": round(tokens[name, "on"] / seconds[name, "on"], 2),
            "on_over_off": round(
                (tokens[name, "on"] / seconds[name, "on"]) / (tokens[name, "off"] / seconds[name, "off"]), 4
            ),
        }
        for name in decoders
    }
    threads = torch.get_num_threads()
    return {
        "switch": switch,
        "dtype": dtype,
        "rows": rows,
        "greedy_identical": same,
        "repeats": repeats,
        "prompts": len(prompts),
        "threads": threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("switch", choices=sorted(SWITCHES))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args.switch, args.repeats, args.max_tokens, args.dtype)
    from rich.console import Console
    from rich.table import Table

    title, off, on = SWITCHES[args.switch]
    table = Table(title=f"{title} (tok/s, in process)")
    for col in ("decoder", off, on, "ratio"):
        table.add_column(col, justify="left" if col == "decoder" else "right")
    for name, row in result["rows"].items():
        table.add_row(name, f"{row['off_tok_s']:.2f}", f"{row['on_tok_s']:.2f}", f"{row['on_over_off']:.3f}x")
    Console(width=120).print(table)
    print(f"greedy output identical: {result['greedy_identical']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if not result["greedy_identical"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
