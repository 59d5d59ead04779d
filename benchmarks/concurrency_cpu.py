"""Speculation at concurrency in process: the workload conversations decoded 8 at a time in one engine, side by side.

The embedded example (target, distilled draft, n-gram pool) and the 24 workload conversations
(``trtspec/data/workloads.jsonl``, categories mixed), in groups of ``--batch`` submitted together to one in-flight
engine (as a server at that concurrency: the batch shrinks as answers finish), greedy. Per round, every group through
each configuration in turn, interleaved so that each meets the same machine: target-only; ``adaptive`` (the default
drafter, which stops choosing for steps where it speculated for nobody: trtspec.speculative.drafters.adaptive);
``adaptive-always`` (the same, choosing every step); ``adaptive-ungated`` (the same without the gate on what
speculating realized per batch size: trtspec.speculative.gate); and any fixed ``--configs`` (e.g. ``ngram:4``).
Reports output tokens per second over all rounds, the ratio to target-only, and greedy identity with target-only
(checked for every conversation). ``--calibrate`` anchors the adaptive policies' cost curves first, as the in-process
Triton model does at start (``calibrate_costs``).

    python benchmarks/concurrency_cpu.py [--batch 8] [--rounds 3] [--max-tokens 96] [--dtype bfloat16] \
        [--configs ngram:4] [--calibrate] [--json F]
    python benchmarks/concurrency_cpu.py --closed-loop 64 [--batch 8] [--max-tokens 48] [--rounds 3]

``--closed-loop N`` measures instead as serving_cpu.py does through Triton, without Triton: ``--batch`` clients, each
sending its next request (serving_cpu's chat questions, streamed) when its last one ends, N requests per run, on one
adaptive engine running on its own thread; speculative requests (K 4) and target-only ones (num_draft_tokens 0)
alternate run by run (``--calibrate``: the policy's costs anchored first, as the in-process Triton model does at
start). Per round: tok/s of both, their ratio, and the steps the drafter skipped.

About 3 minutes on the 2-core machine. Run it alone (under the CPU lock) and note ``uptime``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trtspec.threads import set_wait_policy  # noqa: E402

set_wait_policy()

import torch  # noqa: E402
from workloads_cpu import cpu_description, parse_configs  # noqa: E402

from trtspec.example import example_models  # noqa: E402
from trtspec.prompts import encode_messages, workloads  # noqa: E402
from trtspec.runtimes.torch.decoder import SpeculativeDecoder  # noqa: E402
from trtspec.runtimes.torch.session import TorchSession  # noqa: E402
from trtspec.speculative.adaptive import AdaptivePolicy  # noqa: E402
from trtspec.speculative.drafters.ngram import POOL_FILE, NgramPool  # noqa: E402

ADAPTIVE = ("adaptive", "adaptive-always", "adaptive-ungated")  # the adaptive drafter and two of its parts off


def _example(dtype: str, max_draft_len: int = 4):
    """The example's session (target, draft, tokenizer), its n-gram pool and end-of-sequence ids."""
    paths = example_models()
    session = TorchSession(paths.target, paths.draft, dtype=dtype, max_draft_len=max_draft_len)
    return session, NgramPool.load(paths.draft / POOL_FILE), list(session.decoder.eos_ids)


def _drafter(dec: SpeculativeDecoder):
    """The engine drafter of a decoder's speculative engine (built by its first speculative ``generate``)."""
    return dec._engines[True].drafter


def run(batch: int, rounds: int, max_tokens: int, dtype: str, configs, calibrate: bool) -> dict:
    from rich.progress import Progress

    session, pool, eos = _example(dtype, max([4, *(k for _, k in configs)]))
    target, draft = session.target, session.draft
    decoders: dict[str, tuple[SpeculativeDecoder, bool]] = {
        "target-only": (SpeculativeDecoder(target, None, eos_ids=eos), False)
    }
    policies = {}
    for name in ADAPTIVE:
        policies[name] = AdaptivePolicy()
        dec = SpeculativeDecoder(
            target, draft, max_draft_len=4, eos_ids=eos, drafter="adaptive", ngram_pool=pool, policy=policies[name]
        )
        decoders[name] = (dec, True)
    for kind, k in configs:
        decoders[f"{kind}:{k}"] = (
            SpeculativeDecoder(target, draft, max_draft_len=k, eos_ids=eos, drafter=kind, ngram_pool=pool),
            True,
        )
    convs = [m for ms in zip(*workloads().values()) for m in ms]  # categories interleaved
    prompts = [encode_messages(session.tokenizer, m) for m in convs]
    groups = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
    longest = max(groups, key=lambda g: max(len(p) for p in g))
    for dec, use in decoders.values():  # engines built at their final size, one-time costs out of the timing
        dec.generate(longest, max_tokens, use_draft=use)
    _drafter(decoders["adaptive-always"][0]).quiet_skip_max = 0
    _drafter(decoders["adaptive-ungated"][0]).gate.allows = lambda seqs: True  # every plan goes to the policy
    for name in ADAPTIVE:  # count the timed rounds only
        _drafter(decoders[name][0]).skipped_steps = 0
        policies[name].steps = dict.fromkeys(policies[name].steps, 0)
    if calibrate:
        from trtspec.runtimes.inflight.timing import calibrate as anchor

        for name in ADAPTIVE:
            anchor(policies[name], target, draft, max_batch=batch)
    acc = {name: {"s": 0.0, "tokens": 0, "same": True} for name in decoders}
    with Progress(transient=True) as progress:
        task = progress.add_task("groups", total=rounds * len(groups) * len(decoders))
        for _ in range(rounds):
            for group in groups:
                ref = None
                for name, (dec, use) in decoders.items():
                    t0 = time.perf_counter()
                    out = dec.generate(group, max_tokens, use_draft=use)
                    acc[name]["s"] += time.perf_counter() - t0
                    acc[name]["tokens"] += sum(len(r.token_ids) for r in out)
                    ids = [r.token_ids for r in out]
                    if ref is None:
                        ref = ids
                    acc[name]["same"] &= ids == ref
                    progress.advance(task)
    base = acc["target-only"]
    rows = {
        name: {
            "tok_s": round(a["tokens"] / a["s"], 2),
            "speedup": round((a["tokens"] / a["s"]) / (base["tokens"] / base["s"]), 3),
            "seconds": round(a["s"], 2),
            "identical_greedy": a["same"],
        }
        for name, a in acc.items()
    }
    for name in ADAPTIVE:
        snap = policies[name].snapshot()
        rows[name]["no_speculation_share"] = snap["no_speculation_share"]
        rows[name]["steps"] = snap["steps"]
        rows[name]["skipped_steps"] = _drafter(decoders[name][0]).skipped_steps
        rows[name]["gated_plans"] = _drafter(decoders[name][0]).gate.closed_plans
    return {
        "batch": batch,
        "rounds": rounds,
        "max_tokens": max_tokens,
        "dtype": dtype,
        "conversations": len(prompts),
        "calibrated": calibrate,
        "configs": rows,
        "cpu": cpu_description(),
    }


def closed_loop(clients: int, n: int, rounds: int, max_tokens: int, dtype: str, calibrate: bool) -> dict:
    import threading

    from serving_cpu import QUESTIONS

    from trtspec.runtimes.inflight.jobs import Job
    from trtspec.speculative.rules import SamplingParams

    session, pool, eos = _example(dtype)
    prompts = [session.encode(q) for q in QUESTIONS]
    dec = SpeculativeDecoder(
        session.target, session.draft, max_draft_len=4, eos_ids=eos, drafter="adaptive", ngram_pool=pool
    )
    dec.generate(prompts[:clients], max_tokens)  # the engine, built for the clients, and one-time costs
    engine = dec._engines[True]
    if calibrate:  # as the in-process Triton model does at start
        from trtspec.runtimes.inflight.timing import calibrate as anchor

        anchor(engine.drafter.policy, session.target, session.draft, max_batch=clients)
    engine.start()
    stops = [[t] for t in eos]

    def run(k: int) -> float:
        lock, done = threading.Lock(), threading.Event()
        state = {"sent": 0, "finished": 0, "tokens": 0}

        def submit() -> None:
            i = state["sent"]
            state["sent"] += 1

            def on_tokens(new, _logits, final) -> None:
                with lock:
                    state["tokens"] += len(new)
                    if final:
                        state["finished"] += 1
                        if state["sent"] < n:
                            submit()
                        elif state["finished"] == n:
                            done.set()

            job = Job(
                tokens=list(prompts[i % len(prompts)]),
                max_new=max_tokens,
                on_tokens=on_tokens,
                on_error=lambda exc: print(f"error: {exc}"),
                sampling=SamplingParams(),
                num_draft_tokens=k,
                stop_words=stops,
                stream=True,
            )
            engine.submit(job)

        t0 = time.perf_counter()
        with lock:
            for _ in range(clients):
                submit()
        done.wait()
        return state["tokens"] / (time.perf_counter() - t0)

    out = []
    try:
        for r in range(rounds):
            res: dict = {}
            for k in (4, 0) if r % 2 == 0 else (0, 4):
                skipped = engine.drafter.skipped_steps
                res["speculative" if k else "target-only"] = round(run(k), 2)
                if k:
                    res["skipped_steps"] = engine.drafter.skipped_steps - skipped
            res["speedup"] = round(res["speculative"] / res["target-only"], 3)
            out.append(res)
    finally:
        engine.stop()
    return {
        "clients": clients,
        "requests": n,
        "max_tokens": max_tokens,
        "dtype": dtype,
        "calibrated": calibrate,
        "rounds": out,
    }


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{result['conversations']} workload conversations, {result['batch']} at a time in one engine, "
        f"{result['max_tokens']} tokens, {result['rounds']} rounds, {result['dtype']}"
        + (", calibrated" if result["calibrated"] else "")
    )
    cols = ("config", "tok/s", "vs target-only", "greedy = target-only", "no-speculation share", "skipped", "gated")
    for col in cols:
        table.add_column(col, justify="left" if col == "config" else "right")
    for name, r in result["configs"].items():
        table.add_row(
            name,
            f"{r['tok_s']:.1f}",
            f"{r['speedup']:.3f}x",
            "yes" if r["identical_greedy"] else "NO",
            f"{r['no_speculation_share']:.2f}" if "no_speculation_share" in r else "",
            str(r.get("skipped_steps", "")),
            str(r.get("gated_plans", "")),
        )
    Console(width=120).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--configs", default="", help="fixed drafters besides, e.g. ngram:4")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--closed-loop", type=int, default=0, metavar="N", help="N requests per run (see above)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.batch < 1 or args.rounds < 1:
        sys.exit("error: --batch and --rounds must be >= 1; hint: e.g. --batch 8 --rounds 3")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    if args.closed_loop:
        result = closed_loop(args.batch, args.closed_loop, args.rounds, args.max_tokens, args.dtype, args.calibrate)
        for i, r in enumerate(result["rounds"]):
            print(
                f"round {i}: speculative {r['speculative']:.1f} tok/s, target-only {r['target-only']:.1f}, "
                f"{r['speedup']:.3f}x, {r['skipped_steps']} steps skipped"
            )
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
        return
    configs = parse_configs(args.configs) if args.configs else []
    result = run(args.batch, args.rounds, args.max_tokens, args.dtype, configs, args.calibrate)
    render(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
