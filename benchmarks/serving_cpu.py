"""Serving on a CPU through a real Triton server, measured side by side in one run on the same prompts.

1. Overhead at concurrency 1: output tok/s of the ensemble (preprocessing -> draft-target orchestrator over BLS ->
   postprocessing, gRPC streaming) against in-process decoding of the same prompts with the same greedy settings:
   (a) the same orchestrator and engines called in process (isolates what Triton adds), and (b) the in-process
   `trtspec generate` decoder (TorchSession). Runs alternate (Triton, a, b, Triton, a, b ...) so that load from other
   processes on the machine hits all sides alike; medians are reported.
2. Scaling: output tok/s through Triton at concurrency 1, 4 and 8 (different prompts in flight together), with the
   draft and target-only (num_draft_tokens 0).

    python benchmarks/serving_cpu.py [--max-tokens 48] [--repeats 3] [--pair example|self] [--json out.json]

``--pair self`` serves the target as its own draft (acceptance 1): the orchestration overhead with every draft
accepted. The default is the embedded example (SmolLM2-135M-Instruct, truncated 4-layer draft).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# The same OpenMP setting as the server's model processes (trtspec.serving.server.server_environment), so that the
# in-process baselines are not penalized by spinning threads on a shared machine; must precede importing torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def triton_c1(client, prompts, max_tokens):
    t0 = time.perf_counter()
    tokens = 0
    for p in prompts:
        r = client.generate(p, max_tokens, stream=True, apply_chat_template=True)
        tokens += int(r.stats["num_output_tokens"])
    return tokens / (time.perf_counter() - t0), tokens


def local_c1(engines, deployment, tokenizer, prompts, max_tokens):
    from trtspec.triton_repo.orchestrator import GenRequest, StepParams, generate

    async def one(ids):
        n = 0
        async for chunk in generate(GenRequest(ids, max_tokens, StepParams(end_id=tokenizer.eos_token_id)),
                                    engines, deployment):
            n += len(chunk)
        return n

    encoded = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True)["input_ids"] for p in prompts]
    t0 = time.perf_counter()
    tokens = sum(asyncio.run(one(ids)) for ids in encoded)
    return tokens / (time.perf_counter() - t0), tokens


def session_c1(session, prompts, max_tokens):
    t0 = time.perf_counter()
    tokens = 0
    for p in prompts:
        r = session.generate(p, max_tokens, chat=True)
        tokens += len([t for t in r.token_ids if t not in session.decoder.eos_ids])
    return tokens / (time.perf_counter() - t0), tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pair", choices=["example", "self"], default="example")
    ap.add_argument("--levels", default="1,4,8")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    from trtspec.engines.inflight.engine import InflightEngine
    from trtspec.engines.inflight.local import LocalEngines
    from trtspec.engines.torch_runtime.loading import load_model, load_tokenizer
    from trtspec.engines.torch_runtime.session import TorchSession
    from trtspec.example import example_models, example_spec_dict
    from trtspec.serving.bench import run_level
    from trtspec.serving.client import TritonLLMClient
    from trtspec.serving.server import TritonServer
    from trtspec.spec import spec_from_dict
    from trtspec.triton_repo.orchestrator import Deployment
    from trtspec.triton_repo.writer import write_repo

    console = Console()
    paths = example_models()
    draft_dir = paths.target if args.pair == "self" else paths.draft
    data = example_spec_dict(paths.target, draft_dir)
    data["triton"] = {"orchestrator_instances": 1}
    root = Path(tempfile.mkdtemp(prefix="trtspec-bench-"))
    spec = spec_from_dict(data, base_dir=root, environ={})
    write_repo(spec)
    k = spec.speculative.max_draft_len
    prompts = QUESTIONS[:4]
    levels = [int(x) for x in args.levels.split(",")]

    console.print(f"pair: {args.pair} (target {paths.target.name}, draft {draft_dir.name}), K={k}, "
                  f"max_tokens={args.max_tokens}, {len(prompts)} prompts x {args.repeats} repeats")
    tok = load_tokenizer(paths.target)
    local = LocalEngines({"tensorrt_llm": InflightEngine(load_model(paths.target)).start(),
                          "tensorrt_llm_draft": InflightEngine(load_model(draft_dir)).start()})
    deployment = Deployment(max_draft_len=k, route_threshold=spec.speculative.route_threshold)
    session = TorchSession(paths.target, draft_dir, max_draft_len=k)
    results: dict = {"pair": args.pair, "max_tokens": args.max_tokens, "k": k}
    with TritonServer(spec.repo_dir, log_file=root / "server.log") as server:
        with TritonLLMClient(server.grpc_url) as client:
            client.generate(prompts[0], 8, apply_chat_template=True)  # warm up every path
            local_c1(local, deployment, tok, prompts[:1], 8)
            session_c1(session, prompts[:1], 8)
            runs: dict[str, list[float]] = {"triton": [], "in_process_same_engines": [], "in_process_generate": []}
            for r in range(args.repeats):
                console.print(f"concurrency 1, repeat {r + 1}/{args.repeats}")
                runs["triton"].append(triton_c1(client, prompts, args.max_tokens)[0])
                runs["in_process_same_engines"].append(local_c1(local, deployment, tok, prompts, args.max_tokens)[0])
                runs["in_process_generate"].append(session_c1(session, prompts, args.max_tokens)[0])
        med = {name: statistics.median(v) for name, v in runs.items()}
        results["concurrency_1"] = {"runs": runs, "median_tok_s": med,
                                    "overhead_vs_same_engines": 1 - med["triton"] / med["in_process_same_engines"],
                                    "overhead_vs_generate": 1 - med["triton"] / med["in_process_generate"]}
        scaling = []
        for c in levels:
            row = {"concurrency": c}
            for mode, kk in (("speculative", None), ("target_only", 0)):
                console.print(f"concurrency {c}: {mode}")
                row[mode] = run_level(server.grpc_url, QUESTIONS, c, args.max_tokens, max(2 * c, 4),
                                      {"apply_chat_template": True, "num_draft_tokens": kk})
            scaling.append(row)
        results["scaling"] = scaling
    for e in local.engines.values():
        e.stop()

    t = Table(title="concurrency 1: output tok/s (median of repeats)")
    for col in ("Triton ensemble", "in process, same engines", "in process, trtspec generate",
                "overhead vs same engines", "overhead vs generate"):
        t.add_column(col, justify="right")
    c1 = results["concurrency_1"]
    t.add_row(f"{med['triton']:.2f}", f"{med['in_process_same_engines']:.2f}", f"{med['in_process_generate']:.2f}",
              f"{100 * c1['overhead_vs_same_engines']:.1f}%", f"{100 * c1['overhead_vs_generate']:.1f}%")
    console.print(t)
    t = Table(title="through Triton: output tok/s by concurrency")
    for col in ("concurrency", "speculative tok/s", "target-only tok/s", "acceptance", "TTFT p50 ms",
                "spec. vs c=1", "target-only vs c=1"):
        t.add_column(col, justify="right")
    base_s, base_t = scaling[0]["speculative"]["output_tok_per_s"], scaling[0]["target_only"]["output_tok_per_s"]
    for row in scaling:
        s, to = row["speculative"], row["target_only"]
        t.add_row(str(row["concurrency"]), f"{s['output_tok_per_s']:.2f}", f"{to['output_tok_per_s']:.2f}",
                  f"{s['acceptance_rate']:.2f}", f"{(s['ttft_p50_s'] or 0) * 1000:.0f}",
                  f"{s['output_tok_per_s'] / base_s:.2f}x", f"{to['output_tok_per_s'] / base_t:.2f}x")
    console.print(t)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
