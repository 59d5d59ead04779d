"""`trtspec init`, `check` and `plan`: write, validate and explain a build spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from trtspec.cli._common import console, print_json, resolve_spec
from trtspec.cli._options import JsonOpt, OverwriteOpt, SpecArg
from trtspec.errors import SpecError
from trtspec.spec import Runtime


def _as_written(model: str, output: Path) -> str:
    """A model reference as the spec file must say it: a local path given relative to the working directory becomes
    relative to the spec file's directory (where the spec's paths resolve); a hub id stays as it is."""
    import os

    local = Path(os.path.expanduser(model))
    if local.is_absolute() or not local.exists():
        return model
    return os.path.relpath(os.path.abspath(local), os.path.abspath(output.parent))


def init(
    target: Annotated[
        Optional[str],
        typer.Option(help="target model: a local directory or a hub id org/name; omitted: the embedded example"),
    ] = None,
    draft: Annotated[
        Optional[str],
        typer.Option(help="draft model: a local directory or a hub id org/name; omitted: the embedded example"),
    ] = None,
    runtime: Annotated[Runtime, typer.Option(help="where the models run")] = Runtime.TORCH,
    output: Annotated[Path, typer.Option("--output", "-o", help="spec file to write")] = Path("trtspec.yaml"),
    force: OverwriteOpt = False,
) -> None:
    """Write a commented spec: every field, its default and why. GPU runtimes get bfloat16 and, for each model, the
    best quantization format its shapes allow."""
    from trtspec.spec import spec_from_dict
    from trtspec.spec_doc import commented_yaml

    if output.exists() and not force:
        raise SpecError(f"{output}: already exists", hint="pass --force to overwrite, or -o another path")
    if (target is None) != (draft is None):
        raise SpecError("--target and --draft go together", hint="give both, or neither for the embedded example")
    if target is None:
        from trtspec.example import example_models, example_spec_dict

        paths = example_models()
        data = example_spec_dict(paths.target, paths.draft)
    else:
        assert draft is not None  # --target and --draft go together (above)
        data = {"target": {"model": _as_written(target, output)}, "draft": {"model": _as_written(draft, output)}}
    data["runtime"] = runtime.value
    if runtime is not Runtime.TORCH:
        for role in ("target", "draft"):  # GPU dtypes; quantization: the best format that fits (spec_defaults)
            data[role].update(dtype="bfloat16", quantization=None)
    spec = spec_from_dict(data, source="init", base_dir=output.parent, environ={})
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(commented_yaml(spec), encoding="utf-8")
    tmp.replace(output)
    for path, note in spec.default_notes.items():
        console.print(f"{path}: {note}", highlight=False, markup=False)
    console.print(f"wrote {output}; next: [bold]trtspec check {output}[/]")


_STYLE = {"ok": "green", "warn": "yellow", "error": "bold red"}


def check(spec_path: SpecArg = None, as_json: JsonOpt = False) -> None:
    """Preflight: draft/target compatibility, memory plan (GPU; RAM for the torch runtime), calibration file,
    toolchain. Exit 1 on a blocking problem."""
    from trtspec.build.check import run_check
    from trtspec.build.memory import GIB

    spec = resolve_spec(spec_path)
    report = run_check(spec)
    if as_json:
        print_json(report.to_dict())
    else:
        table = Table(title=f"trtspec check: {spec.name} ({spec.runtime.value})")
        for col in ("check", "status", "detail"):
            table.add_column(col)
        for f in report.findings:
            detail = f.detail + (f"\n[dim]hint: {f.hint}[/]" if f.hint and f.level.value != "ok" else "")
            table.add_row(f.check, f"[{_STYLE[f.level.value]}]{f.level.value}[/]", detail)
        console.print(table)
        if report.memory:
            m = report.memory
            mem = Table(title=f"GPU memory plan ({spec.gpu.memory_gib:g} GiB x {spec.gpu.memory_utilization:g})")
            for col in ("model", "params", "weights/GPU GiB", "KV B/token/GPU", "TP", "KV fraction"):
                mem.add_column(col, justify="right")
            for mm, frac in ((m.target, m.target_kv_fraction), (m.draft, m.draft_kv_fraction)):
                mem.add_row(
                    mm.role,
                    f"{mm.params / 1e6:,.1f}M",
                    f"{mm.weight_bytes_per_gpu / GIB:.2f}",
                    f"{mm.kv_bytes_per_token_per_gpu:,}",
                    str(mm.tp_size),
                    f"{frac:.3f}",
                )
            console.print(mem)
            console.print(
                f"KV budget on GPU 0: {m.free_for_kv_gpu0 / GIB:.2f} GiB = {m.kv_tokens_capacity:,} tokens "
                f"(max_batch_size x max_seq_len = {m.kv_tokens_needed:,})"
            )
    if not report.ok:
        from trtspec.cli._common import err_console

        for f in report.errors:
            err_console.print(
                f"[bold red]error:[/] {f.check}: {f.detail}" + (f" (hint: {f.hint})" if f.hint else ""),
                highlight=False,
                soft_wrap=True,
            )
        raise typer.Exit(1)


def plan(spec_path: SpecArg = None, as_json: JsonOpt = False) -> None:
    """Every stage, its inputs, outputs and external commands, without running anything."""
    from trtspec.plan import build_plan

    spec = resolve_spec(spec_path)
    stages = build_plan(spec)
    if as_json:
        print_json({"spec": spec.to_yaml_dict(), "stages": [s.to_dict() for s in stages]})
        return
    table = Table(title=f"trtspec plan: {spec.name} ({spec.runtime.value})", show_lines=True)
    for col in ("stage", "action", "inputs -> outputs", "commands"):
        table.add_column(col, overflow="fold")
    for s in stages:
        d = s.to_dict()
        table.add_row(
            s.name,
            s.action,
            "\n".join(s.inputs) + ("\n-> " + "\n-> ".join(s.outputs) if s.outputs else ""),
            "\n".join(d["command_lines"]),
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(init)
    app.command()(check)
    app.command()(plan)
