"""`trtspec distill`: train a small draft on the target's own answers (see trtspec.distill)."""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Optional, get_type_hints

import typer
from rich.table import Table

from trtspec.cli._common import console, err_console, print_json, quiet_transformers
from trtspec.cli._options import JsonOpt, ThreadsOpt
from trtspec.distill.settings import DistillSettings, TrainSettings

_REPORT_ROWS = [
    ("acceptance_rate", "held-out greedy acceptance (accepted / proposed)"),
    ("a", "per-token acceptance a"),
    ("tokens_per_step", "tokens per target step"),
    ("c", "cost ratio c (draft step / target step)"),
    ("v", "verify ratio v (K+1 tokens / one)"),
    ("bound_s", "speedup bound S"),
    ("measured_speedup", "measured speedup on held-out prompts"),
    ("identical_greedy", "greedy output identical to target-only"),
    ("predicted_speedup", "predicted speedup (exact simulation, measured costs)"),
    ("head_coverage", "held-out answer tokens the head covers"),
    ("full_head_agreement", "full-vocabulary head proposes as the frequent head"),
    ("train_answer_tokens", "training tokens (target answers)"),
    ("total_s", "wall time (s)"),
]


def _report_table(report: dict, k: int) -> Table:
    table = Table(title=f"distilled draft (K = {k})", show_header=False)
    for key, label in _REPORT_ROWS:
        if key in report:
            table.add_row(label, str(report[key]))
    if report.get("per_position"):
        table.add_row("per-position acceptance (1..8)", " ".join(f"{x:.2f}" for x in report["per_position"]))
    for name, fig in (report.get("drafters") or {}).items():
        if isinstance(fig, dict):
            table.add_row(
                f"{name}: tokens/step, predicted speedup", f"{fig['tokens_per_step']}, {fig['predicted_speedup']}"
            )
    placement = report.get("placement") or {}
    if placement:
        table.add_row(
            "ran on",
            f"teacher {placement['teacher_device']} {placement['teacher_dtype']}, draft "
            f"{placement['draft_device']} (bf16 autocast {placement['train_bf16']}), report "
            f"target {placement['eval_dtype']}",
        )
    return table


def _options(cls: type, panel: str) -> list[inspect.Parameter]:
    """The flags of ``cls``'s fields that have ``cli(...)`` metadata (trtspec.distill.settings): name, type, default
    and help as the settings class declares them."""
    hints = get_type_hints(cls)
    params = []
    for f in fields(cls):
        if "help" not in f.metadata:
            continue
        meta, dashed = f.metadata, f.name.replace("_", "-")
        kind = Optional[str] if meta["parse"] is not None else hints[f.name]
        is_bool = hints[f.name] in (bool, Optional[bool])
        flag = meta["flag"] or (f"--{dashed}/--no-{dashed}" if is_bool else f"--{dashed}")
        option = typer.Option(flag, help=meta["help"], rich_help_panel=panel)
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=Annotated[kind, option]
            )
        )
    return params


def _settings(values: dict[str, Any]) -> DistillSettings:
    """DistillSettings from the flags' values (a flag's text parsed as its field says)."""

    def pick(cls: type) -> dict[str, Any]:
        out = {}
        for f in fields(cls):
            if "help" in f.metadata:
                value = values.pop(f.name)
                parse = f.metadata["parse"]
                out[f.name] = parse(value) if parse is not None and value is not None else value
        return out

    return DistillSettings(**pick(DistillSettings), train=TrainSettings(**pick(TrainSettings)))


def _cli(
    target: Annotated[
        Path, typer.Option("--target", "-t", help="the target model directory (local HF model)", show_default=False)
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="where to write the draft (an HF model directory)", show_default=False)
    ],
    k_alias: Annotated[Optional[int], typer.Option("--k", hidden=True)] = None,  # the older name of --max-draft-len
    work_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--work-dir", help="teacher data and checkpoints (default: a hidden sibling of --out); rerun to resume"
        ),
    ] = None,
    threads: ThreadsOpt = 1,
    ngram_traffic: Annotated[
        Optional[Path],
        typer.Option(
            "--ngram-traffic",
            help="build the n-gram pool from "
            "these texts (the target's served outputs: lines or JSONL "
            "'response') instead of the teacher answers",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The flags of `trtspec distill` that are no setting (the settings' flags come from trtspec.distill.settings)."""


def distill(**values: Any) -> None:
    """Distill a draft for TARGET: the target answers prompts, the draft learns its next-token distributions."""
    from trtspec.distill import DistillError
    from trtspec.distill.pipeline import check_inputs

    target, out, work_dir, threads, ngram_traffic, as_json = (  # _cli's flags; what stays is the settings'
        values.pop(name) for name in ("target", "out", "work_dir", "threads", "ngram_traffic", "as_json")
    )
    k_alias = values.pop("k_alias")
    if k_alias is not None:  # --k, the older name, wins as it always did
        values["k"] = k_alias
    if threads < 1:
        raise DistillError(f"--threads {threads} must be >= 1", hint="1 is fastest on a shared CPU")
    settings = _settings(values)
    check_inputs(target, out, settings, ngram_traffic)  # fail before importing torch or loading anything

    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from trtspec.cli._progress import make_progress
    from trtspec.distill.pipeline import distill as run_distill

    torch.set_num_threads(threads)
    quiet_transformers()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with make_progress(*columns, console=err_console, transient=as_json) as progress:
        result = run_distill(target, out, settings, work_dir=work_dir, progress=progress, traffic=ngram_traffic)
    if as_json:
        print_json({"out": str(result.out), "skipped": result.skipped, "report": result.report})
        return
    if result.skipped:
        err_console.print(f"{out} is up to date (same target, prompts and settings); kept as it is")
    console.print(_report_table(result.report, settings.k))
    console.print(f"draft written to {result.out}")


# The command's flags: _cli's, then every setting (DistillSettings, then TrainSettings), each class in its help panel.
_own = [
    p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(_cli, eval_str=True).parameters.values()
]
distill.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # what typer reads the flags from
    [*_own, *_options(DistillSettings, "Distillation settings"), *_options(TrainSettings, "Training settings")]
)


def register(app: typer.Typer) -> None:
    app.command()(distill)
