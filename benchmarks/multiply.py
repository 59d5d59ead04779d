"""The multiply kernels' weight prefetch measured: into L2 (shipped), into L1 (before), none; in one process.

trtspec's few-row multiplies (trtspec/runtimes/inflight/cpu_kernels_multiply.c) stream every weight of the model
once per pass. Each variant is the shipped source compiled with ``-DPREFETCH_HINT`` / ``-DPREFETCH_ROWS`` overrides
and loaded beside the others; rounds alternate between them, so background load hits them alike. Two parts:

- **the multiplies alone**: the example target's own weights (every Linear of its fused step and the head, in the
  dtype trtspec serves it in on this CPU), 1 / 2 / 5 / 8 rows, median and best ms per pass of all of them;
- **the whole decode** (``--decode``): the example in process, target-only and n-gram K 4 on the same prompts, the
  variant's multiply swapped into the fused step round by round: ms/token and speculation's own ratio per variant,
  and whether every variant gave the same text (the hint changes no arithmetic: it must).

    python benchmarks/multiply.py [--rounds 15] [--decode] [--max-tokens 48] [--json out.json]

(about 1 minute, 4 with --decode, on 2 cores.) Run it on a quiet machine and note ``uptime``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.threads import set_wait_policy  # noqa: E402

set_wait_policy()  # before torch loads

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from trtspec.runtimes.inflight import cpu_kernels  # noqa: E402

VARIANTS = {
    "L2 (shipped)": [],
    "L1": ["-DPREFETCH_HINT=_MM_HINT_T0"],
    "none": ["-DPREFETCH_ROWS=1000000000"],  # the prefetch's condition never holds
}
ROWS = (1, 2, 5, 8)
QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Summarize the plot of Romeo and Juliet in three sentences.",
]


def build(defines: list[str], out_dir: Path) -> dict[str, object]:
    """The kernel library compiled from trtspec's sources with ``defines``; its two multiplies, typed."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise SystemExit("no C compiler")
    out = Path(tempfile.mkstemp(suffix=".so", dir=out_dir)[1])
    flags, libs = cpu_kernels._FLAGS, cpu_kernels._LIBS  # the shipped build's, so only ``defines`` differ
    subprocess.run([compiler, *flags, *defines, *map(str, cpu_kernels.SOURCES), "-o", str(out), *libs], check=True)
    lib = ctypes.CDLL(str(out))
    fns = {}
    for name in ("trtspec_linear_f32", "trtspec_linear_bf16"):
        f = getattr(lib, name)
        f.argtypes, f.restype = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4, None
        fns[name] = f
    return fns


def model_weights(module: torch.nn.Module) -> list[torch.Tensor]:
    """The target's multiply weights as its fused step holds them (the kernel's operands), head included."""
    from trtspec.runtimes.inflight.llama_step import step_of

    step = step_of(module)
    if step is None:
        raise SystemExit("the example target has no fused step here")
    linears = [lin for layer in step.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    if step.head is not None:
        linears.append(step.head)
    return [lin.weight for lin in linears if cpu_kernels.applies(lin.weight)]


def time_multiplies(variants: dict, weights: list[torch.Tensor], rounds: int) -> dict:
    """Per variant and row count: median and best ms of one pass over every weight."""
    name = "trtspec_linear_bf16" if weights[0].dtype == torch.bfloat16 else "trtspec_linear_f32"
    out: dict = {v: {} for v in variants}
    g = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    for m in ROWS:
        xs = {k: torch.randn(m, k, generator=g).to(weights[0].dtype) for k in {w.shape[1] for w in weights}}
        ys = [torch.empty(m, w.shape[0], dtype=w.dtype) for w in weights]
        times: dict = {v: [] for v in variants}
        last: dict = {}
        for _ in range(rounds):
            for v, fns in variants.items():
                f = fns[name]
                t0 = time.perf_counter()
                for w, y in zip(weights, ys):
                    x = xs[w.shape[1]]
                    f(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), m, w.shape[0], w.shape[1], threads)
                times[v].append(time.perf_counter() - t0)
                last[v] = [y.clone() for y in ys]
        ref = next(iter(last.values()))
        for v in variants:
            same = all(torch.equal(a, b) for a, b in zip(last[v], ref))
            out[v][m] = {
                "median_ms": round(1e3 * statistics.median(times[v]), 2),
                "best_ms": round(1e3 * min(times[v]), 2),
                "same_bits": same,
            }
    return out


def time_decode(variants: dict, session, pool, max_tokens: int) -> dict:
    """Per variant: target-only and n-gram K 4 ms/token over the prompts, the variant's multiplies swapped in."""
    from trtspec.runtimes.torch.decoder import SpeculativeDecoder

    eos = list(session.decoder.eos_ids)
    modes = {
        "target-only": SpeculativeDecoder(session.target, None, eos_ids=eos),
        "ngram K4": SpeculativeDecoder(
            session.target, None, max_draft_len=4, eos_ids=eos, drafter="ngram", ngram_pool=pool
        ),
    }
    prompts = [session.encode(q) for q in QUESTIONS]
    shipped = {n: cpu_kernels._state[n] for n in ("trtspec_linear_f32", "trtspec_linear_bf16")}
    acc = {(v, m): [0.0, 0, 0] for v in variants for m in modes}
    texts: dict = {}
    try:
        for dec in modes.values():
            dec.generate([prompts[0]], 8, use_draft=dec is not modes["target-only"])
        for p_i, prompt in enumerate(prompts):
            for v, fns in variants.items():
                cpu_kernels._state.update(fns)  # the fused step calls cpu_kernels.linear, which looks them up
                for m, dec in modes.items():
                    t0 = time.perf_counter()
                    r = dec.generate([prompt], max_tokens, use_draft=m != "target-only")[0]
                    a = acc[(v, m)]
                    a[0] += time.perf_counter() - t0
                    a[1] += len(r.token_ids)
                    a[2] += r.stats.target_steps
                    texts.setdefault((p_i, m), {})[v] = list(r.token_ids)
    finally:
        cpu_kernels._state.update(shipped)
    same = all(len({tuple(t) for t in per.values()}) == 1 for per in texts.values())
    out: dict = {"same_text": same}
    for v in variants:
        row = {}
        for m in modes:
            s, n, steps = acc[(v, m)]
            row[m] = {"ms_per_token": round(1e3 * s / n, 2), "tokens_per_step": round(n / max(1, steps), 3)}
        row["speculation_ratio"] = round(row["target-only"]["ms_per_token"] / row["ngram K4"]["ms_per_token"], 3)
        out[v] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--decode", action="store_true", help="also the whole decode of the example, per variant")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not cpu_kernels.available():
        raise SystemExit("trtspec's CPU kernels are not available on this machine")
    from trtspec.example import example_models
    from trtspec.runtimes.torch.session import TorchSession
    from trtspec.spec_defaults import cpu_dtype
    from trtspec.speculative.drafters.ngram import POOL_FILE, NgramPool

    paths = example_models()
    dtype = cpu_dtype()
    session = TorchSession(paths.target, paths.draft, dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        variants = {v: build(d, Path(tmp)) for v, d in VARIANTS.items()}
        weights = model_weights(session.target)
        result: dict = {
            "dtype": dtype,
            "weights": len(weights),
            "multiplies": time_multiplies(variants, weights, args.rounds),
        }
        if args.decode:
            pool = NgramPool.load(Path(paths.draft) / POOL_FILE)
            result["decode"] = time_decode(variants, session, pool, args.max_tokens)
    from workloads_cpu import cpu_description

    result["cpu"] = cpu_description()
    console = Console()
    t = Table(title=f"the example's {len(weights)} multiplies ({dtype}): median ms per pass (/ L1's)")
    t.add_column("prefetch")
    for m in ROWS:
        t.add_column(f"{m} row{'s' if m > 1 else ''}", justify="right")
    t.add_column("same bits")
    base = result["multiplies"]["L1"]
    for v, per in result["multiplies"].items():
        cells = [f"{per[m]['median_ms']:.1f} ({per[m]['median_ms'] / base[m]['median_ms']:.2f})" for m in ROWS]
        t.add_row(v, *cells, str(all(per[m]["same_bits"] for m in ROWS)))
    console.print(t)
    if args.decode:
        d = result["decode"]
        t = Table(title=f"the example's decode, {args.max_tokens} tokens x {len(QUESTIONS)} prompts, greedy")
        for col in ("prefetch", "target-only ms/token", "n-gram K4 ms/token", "tokens/step", "speculation ratio"):
            t.add_column(col, justify="right")
        for v in VARIANTS:
            r = d[v]
            t.add_row(
                v,
                str(r["target-only"]["ms_per_token"]),
                str(r["ngram K4"]["ms_per_token"]),
                str(r["ngram K4"]["tokens_per_step"]),
                f"{r['speculation_ratio']}x",
            )
        console.print(t)
        console.print(f"same text with every variant: {d['same_text']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
