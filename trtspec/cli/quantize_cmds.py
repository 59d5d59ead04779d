"""`trtspec quantize`: ModelOpt post-training quantization of the target and the draft, and the quality report."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from trtspec.cli._common import console, err_console, print_json, resolve_spec
from trtspec.cli._options import ForceOpt, JsonOpt, OnlyOpt, SpecArg


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "-"


def _num(x: Any, fmt: str = ".2f") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def quality_table(report: dict) -> Table:
    """The quality report as a table: one row per model, one for the draft-target agreement."""
    table = Table(title="quantization quality on held-out calibration text")
    for col in ("model", "format", "top-1 vs unquantized", "perplexity before", "after", "change"):
        table.add_column(col, justify="right" if col != "model" else "left")
    for role, m in report["models"].items():
        table.add_row(
            role,
            str(m.get("format")),
            _pct(m.get("top1_agreement")),
            _num(m.get("perplexity_before")),
            _num(m.get("perplexity_after")),
            f"{_num(m.get('perplexity_change_pct'), '+.1f')}%",
        )
    pair = report["draft_target_top1_agreement"]
    table.add_row(
        "draft vs target", "top-1 agreement", f"before {_pct(pair['before'])}", "", f"after {_pct(pair['after'])}", ""
    )
    return table


def quantize(
    spec_path: SpecArg = None, only: OnlyOpt = None, force: ForceOpt = False, as_json: JsonOpt = False
) -> None:
    """Quantize the target and the draft with NVIDIA ModelOpt into build/<role>/, then write build/quality.json."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from trtspec.build.quality import write_quality_report
    from trtspec.cli._progress import make_progress
    from trtspec.pipeline import quantize_models

    spec = resolve_spec(spec_path)
    roles = (only.value,) if only is not None else ("target", "draft")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with make_progress(*columns, console=err_console, transient=as_json) as progress:
        outcomes = quantize_models(spec, roles, progress, force)
        report = write_quality_report(spec, progress)
    if as_json:
        print_json(
            {
                "models": [
                    {"role": o.role, "path": str(o.path), "status": o.status, "manifest": o.manifest} for o in outcomes
                ],
                "quality": report,
            }
        )
        return
    for o in outcomes:
        m = o.manifest or {}
        if o.status == "not needed":
            console.print(f"{o.role}: quantization none on runtime {spec.runtime.value}: served from {o.path}")
            continue
        t = m.get("timings", {}).get("total_s")
        took = f" in {t:.1f} s" if o.status == "built" and t is not None else ""
        placed = f", calibrated on {m['device']}" if m.get("device") else ""  # where the model went
        console.print(
            f"{o.role}: {m.get('format')} (KV {m.get('kv_cache')}) -> {m.get('export')} {o.path} "
            f"({o.words}{took}){placed}",
            markup=False,
            highlight=False,
        )
        for fix in m.get("fixes", []) if o.status == "built" else []:
            console.print(f"  fixed: {fix}", markup=False, highlight=False)
        for warning in m.get("warnings", []):
            err_console.print(f"  warning: {warning}", style="yellow", markup=False, highlight=False)
    console.print(quality_table(report))
    for note in report["notes"]:
        console.print(f"note: {note}", style="dim", markup=False, highlight=False)
    console.print(f"wrote {spec.build_dir / 'quality.json'}")


def register(app: typer.Typer) -> None:
    app.command()(quantize)
