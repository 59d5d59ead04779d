"""Drafts of the example side by side on the workload answers: tokens per target step and speedup per category.

For a new distillation against the one it would replace: the embedded example's target answers every workload prompt
(``trtspec/data/workloads.jsonl``) greedily once, the step costs are measured once (bfloat16 or float32, with the
first draft; a draft of another shape, depth, MLP or head width, gets its own draft step cost c measured beside the
same target and keeps the first measurement's target costs), and each draft directory (a `trtspec distill` output, or
an unpacked example draft) with its own n-gram pool is replayed on those answers (``workloads_cpu.replay_categories``:
fixed drafters simulated exactly, the adaptive policy replayed, the least-cost decode). Deterministic given the costs:
no timing noise between drafts of one shape, so it shows what a new draft changes; the timed figures are
workloads_cpu.py's.

    python benchmarks/drafts_replayed.py OLD_DRAFT NEW_DRAFT [--configs model:4,ngram:4,hybrid:4,adaptive:4] \
        [--dtype bfloat16] [--max-tokens 96] [--target DIR] [--json F]

About 3 minutes for two drafts on the 2-core machine (``--target``: another target than the example's, e.g. the tiny
random models tests/test_drafts_replayed.py runs it on).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trtspec.threads import set_wait_policy  # noqa: E402

set_wait_policy()

import torch  # noqa: E402
from workloads_cpu import _geo, parse_configs, replay_categories  # noqa: E402

from trtspec.example import example_models  # noqa: E402
from trtspec.prompts import encode_messages, workloads  # noqa: E402
from trtspec.runtimes.torch.costs import measure_step_costs  # noqa: E402
from trtspec.runtimes.torch.decoder import SpeculativeDecoder  # noqa: E402
from trtspec.runtimes.torch.profiling import Reference  # noqa: E402
from trtspec.runtimes.torch.session import TorchSession  # noqa: E402
from trtspec.speculative.drafters.ngram import POOL_FILE, NgramPool  # noqa: E402
from trtspec.speculative.speedup import StepCosts  # noqa: E402


def compare(drafts: list[Path], configs, dtype: str, max_tokens: int, target: Path | None = None) -> dict:
    """Every draft replayed per category (module docstring) against ``target`` (default: the example's)."""
    import statistics

    from rich.progress import Progress

    target = target or example_models().target
    k_max = max(k for _, k in configs)
    refs: dict[str, list] = {}
    costs: StepCosts | None = None  # the first measurement: its target costs price every draft
    by_shape: dict[tuple, StepCosts] = {}  # draft shape -> the first target costs with that shape's draft costs
    out: dict = {"drafts": {}, "dtype": dtype, "max_tokens": max_tokens, "draft_costs": {}}
    with Progress(transient=True) as progress:
        task = progress.add_task("drafts", total=len(drafts))
        for d in drafts:
            session = TorchSession(target, d, dtype=dtype, max_draft_len=k_max)
            if not refs:
                base = SpeculativeDecoder(session.target, None, eos_ids=list(session.decoder.eos_ids))
                for cat, convs in workloads().items():
                    for messages in convs:
                        ids = encode_messages(session.tokenizer, messages)
                        r = base.generate([ids], max_tokens, use_draft=False)[0]
                        refs.setdefault(cat, []).append(Reference(list(ids), list(r.token_ids), max_tokens))
                prompt = int(statistics.mean(len(r.prompt) for rs in refs.values() for r in rs))
            shape = _shape(d)
            if shape not in by_shape:
                own = measure_step_costs(session.target, session.draft, prompt + max_tokens // 2, k_max, prompt)
                if costs is None:
                    costs = own
                    out["costs"] = own.to_dict()
                by_shape[shape] = dataclasses.replace(costs, c=own.c, draft_prefill=own.draft_prefill)
            draft_costs = by_shape[shape]
            out["draft_costs"][str(d)] = draft_costs.c
            pool = NgramPool.load(d / POOL_FILE) if (d / POOL_FILE).is_file() else None
            out["drafts"][str(d)] = replay_categories(session, pool, refs, configs, costs=draft_costs)["categories"]
            progress.advance(task)
    return out


def _shape(draft_dir: Path) -> tuple:
    """What a draft step's cost depends on: depth, MLP width and the frequent head's width."""
    cfg = json.loads((draft_dir / "config.json").read_text())
    head = (cfg.get("trtspec_frequent_head") or {}).get("tokens", cfg.get("vocab_size"))
    return (cfg.get("num_hidden_layers"), cfg.get("intermediate_size"), cfg.get("hidden_size"), head)


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    drafts = list(result["drafts"])
    first = result["drafts"][drafts[0]]
    names = list(next(iter(first.values())))
    cats = list(first)
    cs = ", ".join(f"{Path(d).name} {c:.3f}" for d, c in result.get("draft_costs", {}).items())
    table = Table(
        title=f"drafts replayed on the target's workload answers ({result['dtype']}, draft step c {cs}): "
        "speedup over target-only (tokens per target step), one row per draft"
    )
    table.add_column("category")
    table.add_column("draft")
    for name in names:
        table.add_column(name, justify="right")
    for cat in [*cats, "geomean"]:
        for i, d in enumerate(drafts):
            rows = result["drafts"][d]
            if cat == "geomean":
                cells = [f"{_geo([rows[x][n]['speedup'] for x in cats]):.2f}x" for n in names]
            else:
                cells = [f"{rows[cat][n]['speedup']:.2f}x ({rows[cat][n]['tokens_per_step']:.2f})" for n in names]
            table.add_row(cat if i == 0 else "", Path(d).name, *cells)
    Console(width=max(120, 20 * (len(names) + 2))).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafts", type=Path, nargs="+", help="draft directories (each with its ngram_pool.npz)")
    parser.add_argument("--configs", default="model:4,ngram:4,hybrid:4,adaptive:4")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", type=Path, help="the target's directory (default: the example's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for d in args.drafts:
        if not (d / "config.json").is_file():
            sys.exit(f"error: {d} is not a draft directory (no config.json); hint: pass `trtspec distill` outputs")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    result = compare(args.drafts, parse_configs(args.configs), args.dtype, args.max_tokens, args.target)
    render(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
