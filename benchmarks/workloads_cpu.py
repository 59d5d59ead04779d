"""Drafters per workload category, in process, side by side in one run: fixed (drafter, K) versus adaptive.

The embedded example (SmolLM2-135M-Instruct target, its distilled draft and n-gram pool), the workload prompt set
(``trtspec/data/workloads.jsonl``: multi-turn chat, code, summarization, retrieval-grounded QA, translation, math
reasoning), greedy. For every prompt, interleaved so that every configuration meets the same machine: target-only,
then each configuration on its own decoder (``--configs``, e.g. ``model:4,ngram:4,hybrid:4,adaptive:4``), their order
rotated from prompt to prompt. Per category and configuration: tokens per target step, acceptance, and speedup =
target-only seconds / configuration seconds over the category's prompts; greedy output must equal target-only for
every prompt (checked). Every pass is timed on its own (``pass_seconds``), and ``summary`` compares each adaptive
configuration with each category's best fixed one prompt by prompt (``paired.paired_ratio``: a paired bootstrap
interval, so that a difference of a few per cent can be told from the machine's noise). The adaptive decoder keeps
one policy for the whole run, as a server does (it learns from every request before); ``adaptive-ngram:K`` is the
adaptive drafter without a draft model (n-grams or no draft per sequence and step); ``adaptive-calibrated:K`` is the
adaptive drafter with its cost curves' shapes timed at start (``trtspec.runtimes.inflight.timing.calibrate``, as the
in-process Triton model does), live passes moving only their scale.

    python benchmarks/workloads_cpu.py [--configs ...] [--max-tokens 96] [--repeats 1] [--threads 2] \
        [--dtype float32|bfloat16] [--json F] [--plot F]

Takes about 8 minutes with the default configurations on a quiet 2-core machine. ``run`` and ``summary`` are also
what benchmarks/gpu_check.py runs on a GPU (other models, a device, fewer prompts per category).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # paired.py, next to this script

from trtspec.threads import set_wait_policy  # noqa: E402

set_wait_policy()  # before torch loads: OpenMP waits passively, as in every process trtspec runs torch in

import torch  # noqa: E402
from paired import paired_ratio, verdict  # noqa: E402

from trtspec.prompts import WORKLOAD_CATEGORIES, encode_messages, workloads  # noqa: E402
from trtspec.runtimes.torch.decoder import SpeculativeDecoder  # noqa: E402
from trtspec.speculative.drafters.ngram import POOL_FILE, NgramPool  # noqa: E402

DEFAULT_CONFIGS = "model:4,ngram:4,ngram:2,hybrid:4,adaptive:4"


def parse_configs(text: str) -> list[tuple[str, int]]:
    out = []
    for item in text.split(","):
        kind, _, k = item.partition(":")
        out.append((kind.strip(), int(k or 4)))
    return out


def _timed(dec: SpeculativeDecoder, ids: list[int], n: int, use_draft: bool):
    t0 = time.perf_counter()
    r = dec.generate([ids], n, use_draft=use_draft)[0]
    return time.perf_counter() - t0, r


def run(
    configs,
    max_tokens: int,
    repeats: int,
    categories,
    *,
    models: tuple[Path, Path] | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    prompts_per_category: int | None = None,
    progress=None,
    replayed: bool = True,
) -> dict:
    """The benchmark (module docstring) on ``models`` = (target dir, draft dir) (default: the embedded example), both
    moved to ``device`` in ``dtype``; the first ``prompts_per_category`` conversations of each category (default:
    all); the n-gram pool next to the draft when there is one (else prompt lookup only). ``progress``: a rich
    Progress to add the task to (default: a transient one of its own). ``replayed``: also every configuration
    replayed on the target-only answers with the step costs measured here (``replay_categories``)."""
    from trtspec.runtimes.torch.session import TorchSession

    if models is None:
        from trtspec.example import example_models

        paths = example_models()
        models = (paths.target, paths.draft)
    target_dir, draft_dir = Path(models[0]), Path(models[1])
    session = TorchSession(target_dir, draft_dir, dtype=dtype, max_draft_len=max(k for _, k in configs))
    # Before any pass: the engine's fused step and KV caches are built on the device the weights are on.
    session.target.to(device)
    if session.draft is not None:
        session.draft.to(device)
    pool = NgramPool.load(draft_dir / POOL_FILE) if (draft_dir / POOL_FILE).is_file() else None
    eos = list(session.decoder.eos_ids)
    base = SpeculativeDecoder(session.target, None, eos_ids=eos)
    decoders = {
        f"{kind}:{k}": SpeculativeDecoder(
            session.target,
            session.draft if kind not in ("ngram", "adaptive-ngram") else None,
            max_draft_len=k,
            eos_ids=eos,
            drafter=kind.removesuffix("-ngram").removesuffix("-calibrated"),
            ngram_pool=pool,
        )
        for kind, k in configs
    }
    for name, dec in decoders.items():
        if name.startswith("adaptive-calibrated:"):
            from trtspec.runtimes.inflight.timing import calibrate

            calibrate(dec.policy, session.target, session.draft, max_batch=1)
    sets = {c: convs[:prompts_per_category] for c, convs in workloads().items()}
    warm = encode_messages(session.tokenizer, sets["chat"][0])
    for dec in [base, *decoders.values()]:  # one-time costs (allocation, first passes) out of the measurement
        dec.generate([warm[:32]], 8)
    rows: dict[str, dict[str, dict]] = {}
    refs: dict[str, list] = {}  # per category: the target-only answers (the replay's references)
    from contextlib import nullcontext

    from rich.progress import Progress

    from trtspec.runtimes.torch.profiling import Reference

    todo = sum(len(sets[c]) for c in categories) * repeats
    with nullcontext(progress) if progress is not None else Progress(transient=True) as progress:
        task = progress.add_task("workload prompts", total=todo)
        turn = 0
        for cat in categories:
            acc = {
                name: {"s": 0.0, "tokens": 0, "steps": 0, "drafted": 0, "accepted": 0, "same": True, "passes": []}
                for name in [*decoders, "target-only"]
            }
            for _ in range(repeats):
                for messages in sets[cat]:
                    ids = encode_messages(session.tokenizer, messages)
                    dt, ref = _timed(base, ids, max_tokens, False)
                    if len(refs.setdefault(cat, [])) < len(sets[cat]):
                        refs[cat].append(Reference(list(ids), list(ref.token_ids), max_tokens))
                    a = acc["target-only"]
                    a["s"] += dt
                    a["passes"].append(dt)
                    a["tokens"] += len(ref.token_ids)
                    a["steps"] += ref.stats.target_steps
                    order = list(decoders.items())
                    shift = turn % len(order)  # each configuration takes every place after target-only in turn
                    turn += 1
                    for name, dec in order[shift:] + order[:shift]:
                        dt, r = _timed(dec, ids, max_tokens, True)
                        a = acc[name]
                        a["s"] += dt
                        a["passes"].append(dt)
                        a["tokens"] += len(r.token_ids)
                        a["steps"] += r.stats.target_steps
                        a["drafted"] += r.stats.total_draft_tokens
                        a["accepted"] += r.stats.total_accepted_draft_tokens
                        a["same"] &= r.token_ids == ref.token_ids
                    progress.advance(task)
            base_s = acc["target-only"]["s"]
            rows[cat] = {
                name: {
                    "speedup": round(base_s / a["s"], 3) if a["s"] else 0.0,
                    "tokens_per_step": round(a["tokens"] / a["steps"], 3) if a["steps"] else 0.0,
                    "acceptance": round(a["accepted"] / a["drafted"], 3) if a["drafted"] else 0.0,
                    "draft_tokens": a["drafted"],
                    "seconds": round(a["s"], 3),
                    "pass_seconds": [round(x, 4) for x in a["passes"]],  # per prompt and repeat, in run order
                    "identical_greedy": a["same"],
                }
                for name, a in acc.items()
            }
    adaptive = [n for n in decoders if n.startswith("adaptive")]
    policy = decoders[adaptive[0]].policy.snapshot() if adaptive else None
    replay = replay_categories(session, pool, refs, configs) if replayed else None
    return {
        "replay": replay,
        "categories": rows,
        "configs": list(decoders),
        "max_tokens": max_tokens,
        "adaptive_policy": policy,
        "device": str(device),
        "dtype": dtype,
        "prompts_per_category": {c: len(sets[c]) * repeats for c in categories},
        "ngram_pool": pool is not None,
        "cpu": cpu_description() if str(device) == "cpu" else None,
    }


def replay_categories(session, pool, refs: dict, configs, costs=None) -> dict:
    """Every configuration replayed on the target-only answers of each category (trtspec.speculative.replay): the
    fixed ones simulated exactly, the adaptive ones' policies replayed (one policy per configuration for the whole
    run, categories in the run's order, as the timed run keeps one), and the least-cost decode with every match
    known in advance, all on the step costs (c, v by K, head, prefills) measured here on these models (or ``costs``,
    to compare drafts of one shape on one measurement). Free of the machine's timing noise: what each choice is
    worth on these costs."""
    import statistics

    from trtspec.runtimes.torch.costs import measure_step_costs
    from trtspec.runtimes.torch.profiling import hybrid_profile, replay_answers
    from trtspec.speculative.adaptive import AdaptivePolicy
    from trtspec.speculative.replay import Answers, least_cost, replay
    from trtspec.speculative.speedup import simulate

    k_max = max(k for _, k in configs)
    every = [r for rs in refs.values() for r in rs]
    prompt = int(statistics.mean(len(r.prompt) for r in every))
    if costs is None:
        costs = measure_step_costs(session.target, session.draft, prompt + every[0].max_tokens // 2, k_max, prompt)
    policies = {f"{kind}:{k}": AdaptivePolicy() for kind, k in configs if kind.startswith("adaptive")}
    out: dict = {"costs": costs.to_dict(), "categories": {}}
    for cat, rs in refs.items():
        answers = replay_answers(session.draft, pool, rs, k_max)
        ngram_only = Answers(answers.ngram, answers.ngram_match, None, answers.prompt_lens)
        row = {}
        for kind, k in configs:
            name = f"{kind}:{k}"
            if kind == "model" and answers.model is not None:
                sim = simulate(answers.model, k, costs)
            elif kind == "ngram":
                sim = simulate(answers.ngram, k, costs)
            elif kind == "hybrid" and answers.model is not None:
                sim = simulate(hybrid_profile(answers.ngram, answers.ngram_match, answers.model, c=costs.c), k, costs)
            elif kind.startswith("adaptive"):
                sim = replay(policies[name], ngram_only if kind == "adaptive-ngram" else answers, costs, k)
            else:
                continue
            row[name] = {"speedup": round(sim.speedup, 3), "tokens_per_step": round(sim.tokens_per_step, 3)}
        bounds = [("least cost, n-grams", ngram_only)] + ([("least cost", answers)] if answers.model else [])
        for label, a in bounds:
            sim = least_cost(a, costs, k_max)
            row[f"{label} K<={k_max}"] = {
                "speedup": round(sim.speedup, 3),
                "tokens_per_step": round(sim.tokens_per_step, 3),
            }
        out["categories"][cat] = row
    return out


def cpu_description() -> dict:
    """The CPU the figures belong to: its model name, the vector extensions that decide the step's kernels, cores."""
    import os

    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return {"cores": os.cpu_count()}
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "")
    flags = next((set(ln.split(":", 1)[1].split()) for ln in text.splitlines() if ln.startswith("flags")), set())
    wanted = ("avx2", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16")
    return {"model": name, "extensions": [f for f in wanted if f in flags], "cores": os.cpu_count()}


def _geo(xs) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def summary(result: dict) -> dict:
    """Per configuration: geometric mean and worst speedup over the categories; per category the best fixed one and,
    for each adaptive configuration, how it ran against that one prompt by prompt (``paired.paired_ratio``: adaptive's
    speedup over the best fixed configuration's, > 1 faster, with its 95 % interval and ``verdict``). The best fixed
    one is chosen on the same timings, which favours it: with several fixed configurations of about equal speed the
    fastest of them is partly the luckiest. So each is also compared held out (``versus_held_out``, cross-fitted):
    the passes split in two halves (alternate passes in run order), the best fixed configuration chosen on one half
    and compared with the adaptive one on the other, both ways, the pairs of both halves in one interval."""
    cats = result["categories"]
    names = result["configs"]
    out = {
        name: {
            "geomean": round(_geo([cats[c][name]["speedup"] for c in cats]), 3),
            "worst": round(min(cats[c][name]["speedup"] for c in cats), 3),
        }
        for name in names
    }
    fixed = [n for n in names if not n.startswith("adaptive")]
    best = {c: max(fixed, key=lambda n: cats[c][n]["speedup"]) for c in cats} if fixed else {}
    versus: dict[str, dict[str, dict]] = {}
    held_out: dict[str, dict[str, dict]] = {}
    for name in (n for n in names if n.startswith("adaptive")):
        for c, b in best.items():
            base, mine = cats[c][b].get("pass_seconds"), cats[c][name].get("pass_seconds")
            if base and mine:
                interval = paired_ratio(base, mine)
                versus.setdefault(name, {})[c] = {"best_fixed": b, **interval, "verdict": verdict(interval)}
            held = _held_out(cats[c], fixed, name)
            if held is not None:
                held_out.setdefault(name, {})[c] = held
    return {"per_config": out, "best_fixed": best, "versus_best_fixed": versus, "versus_held_out": held_out}


def _held_out(rows: dict, fixed: list[str], name: str) -> dict | None:
    """Configuration ``name`` against the best of ``fixed`` chosen on the other half of the passes (``summary``);
    None without passes enough to split."""
    target = rows.get("target-only", {}).get("pass_seconds")
    mine = rows[name].get("pass_seconds")
    if not fixed or not target or not mine or len(target) < 2 or any(not rows[f].get("pass_seconds") for f in fixed):
        return None
    halves = [[i for i in range(len(target)) if i % 2 == h] for h in (0, 1)]
    chosen, base, other = [], [], []
    for pick, judge in (halves, halves[::-1]):
        best = max(fixed, key=lambda f: sum(target[i] for i in pick) / sum(rows[f]["pass_seconds"][i] for i in pick))
        chosen.append(best)
        base += [rows[best]["pass_seconds"][i] for i in judge]
        other += [mine[i] for i in judge]
    interval = paired_ratio(base, other)
    return {"best_fixed": chosen, **interval, "verdict": verdict(interval)}


def render(result: dict, console=None) -> None:
    """The table (and the adaptive policy's snapshot) on ``console`` (default: stdout)."""
    from rich.console import Console
    from rich.table import Table

    cats = result["categories"]
    names = result["configs"]
    summ = summary(result)
    table = Table(title=f"speedup over target-only (tokens per target step), in process, {result['max_tokens']} tokens")
    table.add_column("category")
    for name in names:
        table.add_column(name, justify="right")
    table.add_column("best fixed", justify="right")
    for c in cats:
        cells = []
        for name in names:
            r = cats[c][name]
            mark = "" if r["identical_greedy"] else " DIFF"
            cells.append(f"{r['speedup']:.2f}x ({r['tokens_per_step']:.2f}){mark}")
        table.add_row(c, *cells, summ["best_fixed"].get(c, ""))
    table.add_row(
        "geomean (worst)",
        *[f"{summ['per_config'][n]['geomean']:.2f}x ({summ['per_config'][n]['worst']:.2f}x)" for n in names],
        "",
    )
    (console or Console(width=max(120, 24 * (len(names) + 2)))).print(table)
    comparisons = (  # (summary key, title, column of the configuration compared with, what it is)
        ("versus_best_fixed", ", prompt by prompt (95 % bootstrap interval)", "best fixed", "best fixed"),
        ("versus_held_out", " chosen on the other half of the passes", "chosen (halves)", "held-out best"),
    )
    for key, how, chosen_col, base in comparisons:
        for name, per_cat in summ[key].items():
            versus = Table(title=f"{name} against the best fixed configuration{how}")
            for col in ("category", chosen_col, f"{name} / {base}", "interval", "verdict"):
                versus.add_column(col, justify="left" if col in ("category", chosen_col, "verdict") else "right")
            for c, v in per_cat.items():
                chosen = v["best_fixed"] if isinstance(v["best_fixed"], str) else " / ".join(v["best_fixed"])
                versus.add_row(c, chosen, f"{v['ratio']:.3f}x", f"{v['lo']:.3f}-{v['hi']:.3f}", v["verdict"])
            (console or Console(width=120)).print(versus)
    if result.get("replay"):
        render_replay(result["replay"], console)
    if result.get("adaptive_policy"):
        (console or Console(width=160)).print("adaptive policy:", result["adaptive_policy"])


def render_replay(replay: dict, console=None) -> None:
    """The replayed speedups (``replay_categories``): per category and configuration, and their geometric means."""
    from rich.console import Console
    from rich.table import Table

    cats = replay["categories"]
    names = list(next(iter(cats.values())))
    c = replay["costs"]
    body = {int(k): x for k, x in c["body"].items()}
    shape = ", ".join(f"K{k} {body[k]:.2f}" for k in sorted(body) if k in (0, 1, 2, 4, 8))
    table = Table(
        title="replayed on the target-only answers (no timing noise), on the costs measured here in target steps: "
        f"draft step c {c['c']:.3f}, head {c['head']:.3f}, body over K + 1 tokens {shape}"
    )
    table.add_column("category")
    for name in names:
        table.add_column(name, justify="right")
    for cat, row in cats.items():
        table.add_row(cat, *[f"{row[n]['speedup']:.2f}x ({row[n]['tokens_per_step']:.2f})" for n in names])
    table.add_row("geomean", *[f"{_geo([cats[cat][n]['speedup'] for cat in cats]):.2f}x" for n in names])
    (console or Console(width=max(120, 22 * (len(names) + 1)))).print(table)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = list(result["categories"])
    names = result["configs"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(cats))]
        ax.bar(xs, [result["categories"][c][name]["speedup"] for c in cats], width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(cats)), cats)
    ax.set_ylabel("speedup over target-only")
    ax.set_title("Drafters per workload category (in process, greedy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--categories", default=",".join(WORKLOAD_CATEGORIES))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="both models' weights")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    result = run(
        parse_configs(args.configs), args.max_tokens, args.repeats, args.categories.split(","), dtype=args.dtype
    )
    result["dtype"] = args.dtype
    result["summary"] = summary(result)
    render(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
