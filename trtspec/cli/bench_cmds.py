"""`trtspec bench`: load-test a served deployment (Triton or an OpenAI-compatible server)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trtspec.cli._common import console, err_console, print_json
from trtspec.cli._options import JsonOpt, MaxTokensOpt, ProtocolOpt, RawOpt, UrlOpt


def _numbers(flag: str, text: str, cast: type, minimum: float) -> list:
    from trtspec.errors import GenerationError

    try:
        values = sorted({cast(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise GenerationError(f"{flag} {text!r}: expected comma-separated numbers", hint=f"e.g. {flag} 1,2,4") from None
    if not values or min(values) < minimum:
        raise GenerationError(f"{flag} values must be >= {minimum} (got {text!r})", hint=f"e.g. {flag} 1,2,4")
    return values


def bench(
    url: UrlOpt = None,
    openai: Annotated[
        Optional[str], typer.Option("--openai", metavar="URL", help="an OpenAI-compatible server, http://HOST:PORT/v1")
    ] = None,
    protocol: ProtocolOpt = None,
    prompts: Annotated[
        Optional[Path],
        typer.Option(
            "--prompts",
            help="text (one prompt a line) or JSONL (text or prompt, optional max_tokens); omitted: built-in set",
        ),
    ] = None,
    synthetic: Annotated[
        Optional[str],
        typer.Option("--synthetic", metavar="IN,OUT", help="synthetic prompts of ~IN tokens asking ~OUT tokens"),
    ] = None,
    length_spread: Annotated[
        float, typer.Option("--length-spread", help="synthetic lengths uniform within +- this fraction")
    ] = 0.25,
    concurrency: Annotated[
        Optional[str], typer.Option("--concurrency", "-c", help="closed-loop levels, e.g. 1,4,8 (default 1,2,4,8)")
    ] = None,
    request_rate: Annotated[
        Optional[str], typer.Option("--request-rate", help="open-loop Poisson arrivals per second, e.g. 2 or 1,2,4")
    ] = None,
    max_tokens: MaxTokensOpt = 64,
    requests: Annotated[
        int,
        typer.Option("--requests", help="requests per level and mode (default: 2x concurrency, or 10 s of arrivals)"),
    ] = 0,
    num_draft_tokens: Annotated[
        Optional[str],
        typer.Option("--num-draft-tokens", "-k", help="sweep K per request, e.g. 1,2,4,8 (default: the deployment's)"),
    ] = None,
    draft_len: Annotated[Optional[str], typer.Option("--draft-len", hidden=True)] = None,  # the older name
    no_baseline: Annotated[bool, typer.Option("--no-baseline", help="skip the target-only run")] = False,
    raw: RawOpt = False,
    seed: Annotated[int, typer.Option("--seed", help="seed of synthetic prompts and arrivals")] = 0,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write a PNG of the results")] = None,
    metrics: Annotated[
        Optional[str],
        typer.Option(
            "--metrics",
            metavar="URL",
            help="the server's /metrics (e.g. http://127.0.0.1:8002/metrics): report what it counted during the run "
            "(acceptance, tokens per step, steps without a draft, K chosen)",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Load-test a deployment over Triton or the OpenAI API: tok/s, TTFT, ITL, E2E (p50/p90/p99), acceptance, and
    the speedup of each draft length over target-only."""
    from trtspec.errors import GenerationError
    from trtspec.serving.bench import (
        OpenAIRequester,
        TritonRequester,
        load_workload,
        plot_results,
        render_table,
        run_bench,
    )
    from trtspec.serving.bench import synthetic as synthetic_workload
    from trtspec.serving.endpoints import parse_url
    from trtspec.validation import validate_max_tokens

    if (url is None) == (openai is None):
        raise GenerationError(
            "give one of --url (Triton) and --openai (an OpenAI-compatible server)",
            hint="e.g. --url 127.0.0.1:8001, or --openai http://127.0.0.1:9000/v1",
        )
    if concurrency is not None and request_rate is not None:
        raise GenerationError(
            "--concurrency and --request-rate exclude each other",
            hint="closed loop (concurrency) or open loop (Poisson rate)",
        )
    validate_max_tokens(max_tokens)  # the rules `generate` applies, before any request is sent
    if requests < 0:
        raise GenerationError(f"--requests must be >= 0, got {requests}", hint="0 means the default count")
    if url is not None:
        parse_url(url)
    if prompts is not None and synthetic is not None:
        raise GenerationError("--prompts and --synthetic exclude each other", hint="a prompt file or synthetic")
    if synthetic is not None:
        lengths = synthetic.split(",")
        if len(lengths) != 2 or not all(x.strip().isdigit() for x in lengths):
            raise GenerationError(f"--synthetic {synthetic!r}: expected IN,OUT token counts", hint="e.g. 128,64")
        workload = synthetic_workload(int(lengths[0]), int(lengths[1]), spread=length_spread, seed=seed)
    else:
        workload = load_workload(prompts, max_tokens)
    if request_rate is not None:
        load, levels = "request_rate", _numbers("--request-rate", request_rate, float, 1e-6)
    else:
        load, levels = "concurrency", _numbers("--concurrency", concurrency or "1,2,4,8", int, 1)
    sweep = num_draft_tokens if num_draft_tokens is not None else draft_len
    ks = _numbers("--num-draft-tokens", sweep, int, 1) if sweep is not None else None
    requester: OpenAIRequester | TritonRequester
    if openai is not None:
        requester = OpenAIRequester(openai)
    else:
        assert url is not None  # exactly one of --url and --openai (checked above)
        requester = TritonRequester(url, protocol.value if protocol else None)
    from trtspec.serving.bench.server_metrics import delta, describe, scrape

    before = scrape(metrics) if metrics else None
    try:
        results = run_bench(
            requester,
            workload,
            levels,
            load=load,
            num_draft_tokens=ks,
            baseline=not no_baseline,
            chat=not raw,
            requests_per_level=requests or None,
            seed=seed,
            progress=None if as_json else err_console,
        )
    finally:
        requester.close()
    if before is not None and metrics is not None:
        results["server_metrics"] = delta(before, scrape(metrics))
    if plot is not None:
        plot_results(results, plot)
    verdict = _verdict(results, max_tokens)
    if as_json:
        print_json({**results, "verdict": verdict})
        return
    for w in results["warnings"]:
        err_console.print(f"[yellow]warning:[/] {w}")
    console.print(render_table(results))
    if "server_metrics" in results:
        console.print(describe(results["server_metrics"]), highlight=False, markup=False)
    if verdict:
        console.print(verdict, highlight=False, markup=False)
    if plot is not None:
        console.print(f"plot: {plot}")


def _verdict(results: dict, max_tokens: int) -> str | None:
    """Whether speculation (the deployment's K) paid at the first level, and why not."""
    from trtspec.serving.verdict import speedup_verdict

    setup = results.get("setup", {})
    for row in results.get("levels", [])[:1]:
        modes = {m["mode"]: m for m in row["modes"]}
        spec = next((m for m in row["modes"] if m["mode"] != "target_only"), None)
        if spec is None or "target_only" not in modes:
            return None
        level = {
            "speculative": spec,
            "target_only": modes["target_only"],
            "concurrency": row.get("concurrency", row.get("request_rate")),
        }
        k, route = setup.get("max_draft_len"), setup.get("route_threshold")
        return speedup_verdict(level, int(k) if k else None, int(route) if route is not None else None, max_tokens)
    return None


def register(app: typer.Typer) -> None:
    app.command()(bench)
