"""`trtspec repo`: write the Triton model repository."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from trtspec.cli._common import console, print_json, resolve_spec
from trtspec.cli._options import ForceOpt, JsonOpt, SpecArg


def repo(
    spec_path: SpecArg = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the Triton model repository (ensemble, pre/postprocessing, orchestrator, target and draft models)."""
    from trtspec.build.check import check_pair
    from trtspec.pipeline import write_repo

    spec = resolve_spec(spec_path)
    check_pair(spec)  # one tokenizer for both models, before anything is written
    result = write_repo(spec, force=force)
    manifest = result["manifest"] or {}
    if as_json:
        print_json(
            {
                "path": str(result["path"]),
                "skipped": result["skipped"],
                "models": manifest.get("models"),
                "external_paths": manifest.get("external_paths"),
            }
        )
        return
    state = "up to date, kept" if result["skipped"] else "written"
    console.print(f"{result['path']}: {state}")
    table = Table(show_header=True)
    table.add_column("model")
    table.add_column("reads")
    from trtspec.triton_repo.validate import load_configs

    for name, cfg in load_configs(Path(result["path"])).items():
        reads = (
            cfg.parameters["model_dir"].string_value
            if "model_dir" in cfg.parameters
            else (cfg.parameters["tokenizer_dir"].string_value if "tokenizer_dir" in cfg.parameters else "")
        )
        kind = cfg.platform or cfg.backend
        table.add_row(f"{name} ({kind})", reads)
    console.print(table)
    console.print(f"next: [bold]trtspec serve {result['path']}[/]")


def register(app: typer.Typer) -> None:
    app.command()(repo)
