"""Speculative decoding on a CPU, measured side by side in one run on the same prompts.

For each pair: target-only tok/s (transformers' generate, and trtspec with no draft), transformers' assisted generation
tok/s (constant K), trtspec speculative tok/s, measured acceptance a (accepted / proposed), draft cost ratio c (one
draft step / one target step), verify cost ratio v (one verification / one target step: the body over K + 1 tokens
plus the head where the decoder applies it), the bound S = (tokens per target step) / (K c + v), and
efficiency = measured speedup / S (speedup of trtspec speculative over trtspec target-only: the same code path that the
bound models). Pairs: (i) draft == target (a = 1: isolates our overhead), (ii) the embedded example, with its draft
model, with the n-gram drafter (prompt lookup + the shipped pool; compared with transformers' prompt lookup decoding)
and with the hybrid drafter, (iii) tiny random models (a ~ 0: the overhead bound when no draft token is ever accepted).

    python benchmarks/speculative_cpu.py [--max-tokens 64] [--k 4] [--json out.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.runtimes.torch.costs import speedup_bound, step_cost_ratios  # noqa: E402
from trtspec.runtimes.torch.decoder import SpeculativeDecoder  # noqa: E402
from trtspec.speculative.drafters.ngram import POOL_FILE  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that checks whether a number is prime.",
    "Explain why the sky is blue in two sentences.",
    "Give me three tips for learning a new language.",
]


@dataclass
class Row:
    pair: str
    k: int
    hf_target_tok_s: float
    hf_assisted_tok_s: float
    target_only_tok_s: float
    trtspec_tok_s: float
    acceptance: float
    c: float
    v: float
    bound_s: float
    speedup: float
    efficiency: float
    vs_assisted: float
    identical_greedy: bool


def _hf_kwargs(max_tokens, eos, assistant=None, k=4, prompt_lookup=False) -> dict:
    kwargs = dict(max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0)
    if prompt_lookup:  # transformers' prompt lookup decoding: the n-gram drafter's nearest counterpart
        kwargs["prompt_lookup_num_tokens"] = k
    elif assistant is not None:
        assistant.generation_config.num_assistant_tokens = k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = assistant
    return kwargs


@torch.inference_mode()
def run_methods(target, draft, dec: SpeculativeDecoder, prompts, max_tokens, eos, k) -> dict:
    """Each prompt through every method in turn (interleaved, so background load hits all methods alike)."""
    lookup = dec.drafter.value == "ngram"
    methods = {
        "hf_target": lambda p: target.generate(torch.tensor([p]), **_hf_kwargs(max_tokens, eos))[0, len(p) :].tolist(),
        "hf_assisted": lambda p: target.generate(torch.tensor([p]), **_hf_kwargs(max_tokens, eos, draft, k, lookup))[
            0, len(p) :
        ].tolist(),
        "target_only": lambda p: dec.generate([p], max_tokens, num_draft_tokens=k, use_draft=False)[0],
        "trtspec": lambda p: dec.generate([p], max_tokens, num_draft_tokens=k)[0],
    }
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    outputs: dict[str, list] = {m: [] for m in methods}
    proposed = accepted = steps = emitted = 0
    for p in prompts:
        for name, fn in methods.items():
            t0 = time.perf_counter()
            out = fn(p)
            seconds[name] += time.perf_counter() - t0
            if not isinstance(out, list):
                if name == "trtspec":
                    proposed += out.stats.total_draft_tokens
                    accepted += out.stats.total_accepted_draft_tokens
                    steps += out.stats.target_steps
                    emitted += out.stats.num_output_tokens
                out = out.token_ids
            tokens[name] += len(out)
            outputs[name].append(out)
    tps = {m: tokens[m] / seconds[m] for m in methods}
    identical = outputs["trtspec"] == outputs["target_only"] == outputs["hf_target"]
    return {
        "tps": tps,
        "acceptance": accepted / proposed if proposed else 0.0,
        "identical": identical,
        "tokens_per_step": emitted / steps if steps else 1.0,
    }


def measure_pair(name, target, draft, prompts, eos, k, max_tokens, drafter="model", pool=None) -> Row:
    """``drafter`` ngram: trtspec's n-gram drafter (prompt lookup + ``pool``) against transformers' prompt lookup;
    model and hybrid: against transformers' assisted generation with the draft model."""
    dec = SpeculativeDecoder(target, draft, max_draft_len=k, eos_ids=eos, drafter=drafter, ngram_pool=pool)
    run_methods(target, draft, dec, prompts[:1], 8, eos, k)  # warm-up: first calls allocate
    m = run_methods(target, draft, dec, prompts, max_tokens, eos, k)
    tps, a = m["tps"], m["acceptance"]
    context = int(statistics.mean(len(p) for p in prompts)) + max_tokens // 2
    c, v = step_cost_ratios(target, draft, context, k, m["tokens_per_step"])
    if drafter == "ngram":
        c = 0.0  # a table lookup: no draft forward pass
    s = speedup_bound(m["tokens_per_step"], k, c, v)
    speedup = tps["trtspec"] / tps["target_only"]
    return Row(
        name,
        k,
        tps["hf_target"],
        tps["hf_assisted"],
        tps["target_only"],
        tps["trtspec"],
        a,
        c,
        v,
        s,
        speedup,
        speedup / s,
        tps["trtspec"] / tps["hf_assisted"],
        m["identical"],
    )


def tiny_random_pair():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    common = dict(
        vocab_size=2048,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    target = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=512,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=1536,
            **common,
        )
    ).eval()
    draft = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=128,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=256,
            **common,
        )
    ).eval()
    prompts = [torch.randint(3, 2048, (n,)).tolist() for n in (12, 30, 50, 20)]
    return target, draft, prompts


def render(rows: list[Row]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="speculative decoding on CPU (tok/s, same prompts, one run)")
    cols = [
        "pair",
        "K",
        "HF target",
        "HF assisted",
        "target-only",
        "trtspec",
        "a",
        "c",
        "v",
        "bound S",
        "speedup",
        "efficiency",
        "vs assisted",
        "greedy identical",
    ]
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r.pair,
            str(r.k),
            f"{r.hf_target_tok_s:.1f}",
            f"{r.hf_assisted_tok_s:.1f}",
            f"{r.target_only_tok_s:.1f}",
            f"{r.trtspec_tok_s:.1f}",
            f"{r.acceptance:.3f}",
            f"{r.c:.3f}",
            f"{r.v:.2f}",
            f"{r.bound_s:.2f}",
            f"{r.speedup:.2f}x",
            f"{r.efficiency:.2f}",
            f"{r.vs_assisted:.2f}x",
            "yes" if r.identical_greedy else "NO",
        )
    Console(width=200).print(table)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["HF target", "HF assisted", "trtspec target-only", "trtspec speculative"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.2
    for j, attr in enumerate(["hf_target_tok_s", "hf_assisted_tok_s", "target_only_tok_s", "trtspec_tok_s"]):
        xs = [i + (j - 1.5) * width for i in range(len(rows))]
        ax.bar(xs, [getattr(r, attr) for r in rows], width, label=labels[j])
    ax.set_xticks(range(len(rows)), [f"{r.pair}\na={r.acceptance:.2f}" for r in rows])
    ax.set_ylabel("output tokens / s")
    ax.set_title("Speculative decoding on CPU (higher is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument(
        "--pairs",
        default="self,example,ngram,hybrid,tiny",
        help="comma-separated subset of self,example,ngram,hybrid,tiny (ngram and hybrid: the "
        "example's target with the n-gram / hybrid drafter and the shipped n-gram pool)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    wanted = args.pairs.split(",")
    rows: list[Row] = []
    if {"self", "example", "ngram", "hybrid"} & set(wanted):
        from trtspec.example import example_models
        from trtspec.runtimes.torch.session import TorchSession

        paths = example_models()
        session = TorchSession(paths.target, paths.draft, max_draft_len=args.k)
        prompts = [session.encode(q) for q in QUESTIONS]
        eos = list(session.decoder.eos_ids)
        if "self" in wanted:
            rows.append(
                measure_pair(
                    "(i) draft == target", session.target, session.target, prompts, eos, args.k, args.max_tokens
                )
            )
        if "example" in wanted:
            from trtspec.example import example_draft

            rows.append(
                measure_pair(
                    f"(ii) example ({Path(example_draft()).name})",
                    session.target,
                    session.draft,
                    prompts,
                    eos,
                    args.k,
                    args.max_tokens,
                )
            )
        pool = Path(paths.draft) / POOL_FILE
        for kind in ("ngram", "hybrid"):
            if kind in wanted:
                rows.append(
                    measure_pair(
                        f"(ii) example, {kind} drafter",
                        session.target,
                        session.draft,
                        prompts,
                        eos,
                        args.k,
                        args.max_tokens,
                        drafter=kind,
                        pool=pool if pool.is_file() else None,
                    )
                )
    if "tiny" in wanted:
        target, draft, prompts = tiny_random_pair()
        rows.append(measure_pair("(iii) tiny random", target, draft, prompts, [], args.k, args.max_tokens))
    render(rows)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    if args.plot:
        plot(rows, args.plot)
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
