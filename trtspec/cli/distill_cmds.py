"""`trtspec distill`: train a small draft on the target's own answers (see trtspec.distill)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from trtspec.cli._common import console, err_console, print_json, quiet_transformers
from trtspec.cli._options import JsonOpt, ThreadsOpt

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


def _parse_layers(text: str | None) -> tuple[int, ...] | None:
    from trtspec.distill import DistillError

    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise DistillError(
            f"--init-layers {text!r} is not a comma-separated list of layer indices", hint="e.g. --init-layers 0,1"
        ) from None


def distill(
    target: Annotated[
        Path, typer.Option("--target", "-t", help="the target model directory (local HF model)", show_default=False)
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="where to write the draft (an HF model directory)", show_default=False)
    ],
    prompts: Annotated[
        Optional[Path],
        typer.Option(
            help="prompts the target answers (one per line, or JSONL with 'prompt'); default: the shipped set"
        ),
    ] = None,
    layers: Annotated[int, typer.Option(help="draft depth (decoder layers)")] = 2,
    init_layers: Annotated[
        Optional[str],
        typer.Option("--init-layers", help="target layers to start from, e.g. 0,1 (default: the first --layers)"),
    ] = None,
    head_tokens: Annotated[
        int,
        typer.Option(
            "--head-tokens",
            help="head width: the most frequent tokens of the target's answers that the draft can propose",
        ),
    ] = 8192,
    intermediate_size: Annotated[
        Optional[int], typer.Option("--intermediate-size", help="MLP width (default: the target's)")
    ] = None,
    tokens: Annotated[
        int, typer.Option(help="answer tokens of training data the target generates (at most)")
    ] = 110_000,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="answer length per prompt")] = 128,
    gen_batch_size: Annotated[int, typer.Option("--gen-batch-size", help="prompts answered per batch")] = 64,
    answers_per_prompt: Annotated[
        int, typer.Option("--answers-per-prompt", help="answers per prompt: the first greedy, the others sampled")
    ] = 2,
    sample_temperature: Annotated[
        float, typer.Option("--sample-temperature", help="temperature of the sampled answers")
    ] = 0.8,
    top_k: Annotated[int, typer.Option("--top-k", help="teacher distribution: the target's top-k")] = 20,
    steps: Annotated[int, typer.Option(help="training steps")] = 600,
    batch_size: Annotated[int, typer.Option("--batch-size", help="answers per training step")] = 16,
    lr: Annotated[float, typer.Option(help="peak learning rate (AdamW, cosine decay)")] = 1e-3,
    seed: Annotated[int, typer.Option(help="seed of the training order")] = 0,
    k: Annotated[
        int,
        typer.Option("--max-draft-len", help="K the report measures at (the deployment's speculative.max_draft_len)"),
    ] = 4,
    k_alias: Annotated[Optional[int], typer.Option("--k", hidden=True)] = None,  # the older name
    eval_prompts: Annotated[int, typer.Option("--eval-prompts", help="held-out prompts in the report")] = 12,
    eval_max_tokens: Annotated[int, typer.Option("--eval-max-tokens", help="answer length in the report")] = 96,
    held_out: Annotated[float, typer.Option("--held-out", help="fraction of prompts held out")] = 0.06,
    work_dir: Annotated[
        Optional[Path],
        typer.Option(
            "--work-dir", help="teacher data and checkpoints (default: a hidden sibling of --out); rerun to resume"
        ),
    ] = None,
    threads: ThreadsOpt = 1,
    bf16: Annotated[
        Optional[bool],
        typer.Option(
            "--bf16/--no-bf16", help="bfloat16 autocast while training (default: where the device supports it)"
        ),
    ] = None,
    loss: Annotated[
        str, typer.Option(help="fkl (target's top-k), tvd (total variation) or fkl+ce (plus the greedy label)")
    ] = "fkl",
    device: Annotated[
        str,
        typer.Option(
            help="auto (the GPUs when there are any: teacher device_map=auto, draft on the first), cpu or cuda"
        ),
    ] = "auto",
    teacher_dtype: Annotated[
        str,
        typer.Option(
            "--teacher-dtype", help="auto (bfloat16 where the hardware has it), float32, bfloat16, float16 (GPU)"
        ),
    ] = "auto",
    ngram_traffic: Annotated[
        Optional[Path],
        typer.Option(
            "--ngram-traffic",
            help="build the n-gram pool from "
            "these texts (the target's served outputs: lines or JSONL "
            "'response') instead of the teacher answers",
        ),
    ] = None,
    ngram_pool: Annotated[
        bool,
        typer.Option("--ngram-pool/--no-ngram-pool", help="write ngram_pool.npz for the n-gram and hybrid drafters"),
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Distill a draft for TARGET: the target answers prompts, the draft learns its next-token distributions."""
    from trtspec.distill import DistillError
    from trtspec.distill.pipeline import check_dirs
    from trtspec.distill.settings import DistillSettings, TrainSettings

    k = k_alias if k_alias is not None else k
    if threads < 1:
        raise DistillError(f"--threads {threads} must be >= 1", hint="1 is fastest on a shared CPU")
    settings = DistillSettings(
        prompts=prompts,
        layers=layers,
        init_layers=_parse_layers(init_layers),
        head_tokens=head_tokens,
        intermediate_size=intermediate_size,
        tokens=tokens,
        max_new_tokens=max_new_tokens,
        gen_batch_size=gen_batch_size,
        answers_per_prompt=answers_per_prompt,
        sample_temperature=sample_temperature,
        top_k=top_k,
        held_out=held_out,
        eval_prompts=eval_prompts,
        eval_max_tokens=eval_max_tokens,
        k=k,
        device=device,
        teacher_dtype=teacher_dtype,
        ngram_pool=ngram_pool,
        train=TrainSettings(steps=steps, batch_size=batch_size, lr=lr, seed=seed, bf16=bf16, loss=loss),
    )
    settings.validate()  # what needs no model: fail before importing torch or loading anything
    check_dirs(target, out)
    if ngram_traffic is not None and not ngram_traffic.is_file():
        raise DistillError(
            f"--ngram-traffic {ngram_traffic}: file not found", hint="one text per line, or JSONL with 'response'"
        )

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
    console.print(_report_table(result.report, k))
    console.print(f"draft written to {result.out}")


def register(app: typer.Typer) -> None:
    app.command()(distill)
