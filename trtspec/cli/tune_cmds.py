"""`trtspec tune`: choose the draft length K and the route threshold from measurements (see trtspec.tune)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from trtspec.cli._common import console, err_console, print_json, quiet_transformers, resolve_spec
from trtspec.cli._options import JsonOpt, MaxTokensOpt, SpecArg, ThreadsOpt, UrlOpt
from trtspec.speculative.rules import MAX_DRAFT_LEN, check_max_draft_len


def _table(result) -> Table:
    table = Table(title=f"trtspec tune: drafter {result.drafter}, {result.source}")
    for col in ("K", "tokens/step", "a", "v", "predicted speedup", "measured speedup", "c, v in the loop"):
        table.add_column(col, justify="right")
    for row in result.rows:

        def cell(key: str, row: dict = row) -> str:
            v = row.get(key)
            return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

        style = "bold green" if row["k"] == result.k else None
        loop = "-" if row.get("v_in_loop") is None else f"{cell('c_in_loop')}, {cell('v_in_loop')}"
        table.add_row(
            str(row["k"]),
            cell("tokens_per_step"),
            cell("a"),
            cell("v"),
            cell("predicted_speedup"),
            cell("measured_speedup"),
            loop,
            style=style,
        )
    return table


def tune(
    spec_path: SpecArg = None,
    prompts: Annotated[
        Optional[Path],
        typer.Option(
            help="prompts to tune on (one per line, or JSONL: 'prompt' or 'messages'); "
            "default: the held-out shipped distillation prompts"
        ),
    ] = None,
    workloads: Annotated[
        bool,
        typer.Option(
            "--workloads",
            help="tune on the workload set (multi-turn chat, code, summarization, retrieval-grounded QA, "
            "translation, math; conversations taken in turn from each), in process",
        ),
    ] = False,
    url: UrlOpt = None,
    n_prompts: Annotated[int, typer.Option("--n-prompts", help="prompts used")] = 8,
    max_tokens: MaxTokensOpt = 64,
    k_max: Annotated[int, typer.Option("--k-max", help=f"largest K considered (1..{MAX_DRAFT_LEN})")] = MAX_DRAFT_LEN,
    measure: Annotated[
        int, typer.Option(help="time the decoder at this many of the best predicted K (0: predict only)")
    ] = 4,
    costs: Annotated[
        Optional[Path],
        typer.Option(
            help="step costs to use instead of timing them here (JSON: "
            '{"c": 0.1, "v": {"1": 1.05, ...}}), e.g. measured on '
            "the serving GPU"
        ),
    ] = None,
    write: Annotated[bool, typer.Option("--write", help="write the choice into SPEC (else show the diff)")] = False,
    threads: ThreadsOpt = 1,
    as_json: JsonOpt = False,
) -> None:
    """Measure acceptance, c and v on a prompt set (in process, or from a server with --url); choose K and the
    route threshold that maximise the speedup."""
    from trtspec.errors import GenerationError, SpecError

    check_max_draft_len(k_max, "--k-max")
    if n_prompts < 1 or max_tokens < 2 or measure < 0 or threads < 1:
        raise SpecError(
            "--n-prompts, --threads must be >= 1, --max-tokens >= 2, --measure >= 0",
            hint="e.g. --n-prompts 8 --max-tokens 64",
        )
    if workloads and (prompts is not None or url is not None):
        raise SpecError(
            "--workloads takes neither --prompts nor --url",
            hint="the workload set's conversations run in process; a server is tuned on --prompts",
        )
    if write and spec_path is None:
        raise SpecError("--write needs a spec file", hint="trtspec tune trtspec.yaml --write")
    step_costs = None
    if costs is not None:
        from trtspec.speculative.speedup import StepCosts

        try:
            step_costs = StepCosts.from_dict(json.loads(costs.read_text(encoding="utf-8")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SpecError(
                f"--costs {costs}: {exc}", hint='JSON like {"c": 0.1, "v": {"1": 1.05, "2": 1.1}}'
            ) from None
    spec = resolve_spec(spec_path)
    from trtspec.prompts import load_prompts
    from trtspec.tune import default_prompts, tune_in_process, tune_url, workload_prompts

    if workloads:
        texts: list = workload_prompts(n_prompts)
    else:
        texts = (load_prompts(prompts) if prompts is not None else default_prompts(n_prompts))[:n_prompts]
    ks = range(1, k_max + 1)
    if url is not None:
        result = tune_url(spec, url, texts, ks=ks, max_tokens=max_tokens)
    else:
        from trtspec.threads import apply_threads

        apply_threads(threads)
        quiet_transformers()
        with err_console.status("tuning") as status:
            result = tune_in_process(
                spec,
                texts,
                ks=ks,
                max_tokens=max_tokens,
                measure_top=measure,
                costs=step_costs,
                progress=lambda text: status.update(text),
            )
    if not result.rows:
        raise GenerationError("nothing was measured", hint="check the prompts")
    _report(spec, spec_path, result, write, as_json)


def _report(spec, spec_path: Path | None, result, write: bool, as_json: bool) -> None:
    from trtspec.spec_edit import diff, set_section_values, write_checked

    values = {"max_draft_len": result.k, "route_threshold": result.route_threshold}
    change = ""
    if spec_path is not None:
        old = spec_path.read_text(encoding="utf-8")
        new = set_section_values(old, "speculative", values)
        change = diff(old, new, spec_path.name)
        if write and new != old:
            write_checked(spec_path, new)
    if as_json:
        print_json({**result.to_dict(), "diff": change, "written": bool(write and change)})
        return
    console.print(_table(result))
    if result.per_position:
        console.print("per-position acceptance: " + " ".join(f"{x:.2f}" for x in result.per_position))
    for note in result.notes:
        err_console.print(f"[dim]note:[/] {note}")
    console.print(
        f"choice: max_draft_len {result.k}, route_threshold {result.route_threshold} "
        f"(now {result.current['max_draft_len']}, {result.current['route_threshold']})"
    )
    if spec_path is None:
        console.print("(the embedded example: pass a spec file to see or write the change)")
    elif not change:
        console.print(f"{spec_path} already has these values")
    elif write:
        console.print(f"wrote {spec_path}")
    else:
        console.print(change.rstrip("\n"))
        console.print("rerun with --write to apply it")


def register(app: typer.Typer) -> None:
    app.command()(tune)
