"""`trtspec repo`, `serve` and `bench`, and the remote branch of `generate` (``--url``)."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from trtspec.cli._common import console, err_console, print_json, resolve_spec
from trtspec.cli._options import JsonOpt, Protocol, ProtocolOpt, SpecArg
from trtspec.errors import ServerError

RepoArg = Annotated[Optional[Path], typer.Argument(help="model repository; omitted: ./triton_repo", show_default=False)]


def repo(
    spec_path: SpecArg = None,
    force: Annotated[bool, typer.Option("--force", help="rewrite even when up to date")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write the Triton model repository (ensemble, pre/postprocessing, orchestrator, target and draft models)."""
    from trtspec.triton_repo.writer import write_repo
    from trtspec.validation import check_pair

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


def serve(
    repo_path: RepoArg = None,
    http_port: Annotated[int, typer.Option("--http-port", help="0 picks a free port")] = 8000,
    grpc_port: Annotated[int, typer.Option("--grpc-port", help="0 picks a free port")] = 8001,
    metrics_port: Annotated[int, typer.Option("--metrics-port", help="0 picks a free port")] = 8002,
    docker: Annotated[
        Optional[str], typer.Option("--docker", metavar="IMAGE", help="serve in this tritonserver image (docker run)")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="with --docker: print the command only")] = False,
    host: Annotated[str, typer.Option("--host", help="address to listen on; 0.0.0.0 for remote clients")] = "127.0.0.1",
    log_file: Annotated[Optional[Path], typer.Option("--log-file", help="server log")] = None,
    ready_timeout: Annotated[float, typer.Option("--ready-timeout", help="seconds to wait for ready")] = 300.0,
    openai_port: Annotated[
        Optional[int],
        typer.Option(
            "--openai-port", help="also serve the OpenAI-compatible API (/v1) on this port; 0 picks a free port"
        ),
    ] = None,
    drain_timeout: Annotated[
        float,
        typer.Option("--drain-timeout", help="on Ctrl-C / SIGTERM: seconds in-flight requests may take to finish"),
    ] = 30.0,
    stub_watch: Annotated[
        bool,
        typer.Option("--stub-watch/--no-stub-watch", help="notice a dead model stub, report it and reload its model"),
    ] = True,
) -> None:
    """Serve a model repository with tritonserver until Ctrl-C (or SIGTERM), then drain: new requests are refused,
    in-flight ones finish (cut with an error at --drain-timeout). The server never outlives this."""
    path = (repo_path or Path("triton_repo")).resolve()
    _require_repository(path)  # before anything is started or written (the log included)
    if docker is not None:
        if openai_port is not None:
            raise ServerError(
                "--openai-port does not apply with --docker (the plain tritonserver image has no frontend)",
                hint="run the trtspec image (docker/), which serves the OpenAI API on 9000",
            )
        _serve_docker(path, docker, http_port or 8000, grpc_port or 8001, metrics_port or 8002, dry_run)
        return
    from trtspec.serving.lifecycle import supervise
    from trtspec.serving.server import TritonServer

    if drain_timeout < 0:
        raise ServerError(f"--drain-timeout must be >= 0, got {drain_timeout:g}", hint="0 cuts in-flight requests")
    server = TritonServer(
        path,
        http_port=http_port or None,
        grpc_port=grpc_port or None,
        metrics_port=metrics_port or None,
        log_file=log_file,
        ready_timeout_s=ready_timeout,
        host=host,
        model_control=stub_watch,
    )
    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    front = None  # the OpenAI-compatible frontend (trtspec.serving.openai): port bound first, serving once Triton is
    try:
        if openai_port is not None:
            from trtspec.serving.openai.frontend import OpenAIFrontend

            front = OpenAIFrontend(path, server.grpc_url, host=host, port=openai_port or None).prepare()
        with err_console.status(f"starting tritonserver (log: {server.log_file})"):
            server.start()
            if front is not None:
                front.start()

        def say_ready() -> None:
            console.print(
                f"ready: gRPC {server.grpc_url}, HTTP {server.http_url}, metrics {server.metrics_url}"
                + (f", OpenAI {front.base_url}" if front is not None else "")
            )
            console.print(f"try: trtspec generate 'What is speculative decoding?' --url {server.grpc_url}")
            console.print(f"Ctrl-C drains (up to {drain_timeout:g} s) and stops the server")

        supervise(
            server,
            stop,
            lambda line: err_console.print(line, highlight=False, soft_wrap=True),
            watch=stub_watch,
            check=front.check if front is not None else None,
            started=say_ready,
        )
        if server.exit_code() is None:
            err_console.print(
                f"draining: new requests are refused, in-flight ones have {drain_timeout:g} s (Ctrl-C again stops now)"
            )
            result = server.drain(drain_timeout, abort=lambda: len(signals) > 1)
            err_console.print(result.line() if len(signals) < 2 else "stopping now (second signal)")
    finally:
        if front is not None:
            front.stop()
        if server.pid is not None:  # a server that never started (or already stopped itself) needs no message
            err_console.print("stopping tritonserver")
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _require_repository(path: Path) -> None:
    """A Triton model repository: a directory with at least one <model>/config.pbtxt."""
    if not path.is_dir():
        raise ServerError(f"{path}: no such model repository", hint="`trtspec repo` writes one")
    if not any(p.is_file() for p in path.glob("*/config.pbtxt")):
        raise ServerError(
            f"{path}: not a Triton model repository (no <model>/config.pbtxt in it)",
            hint="`trtspec repo` writes one (default ./triton_repo)",
        )


def _serve_docker(path: Path, image: str, http: int, grpc: int, metrics: int, dry_run: bool) -> None:
    import os
    import shlex
    import shutil

    from trtspec.engines.engine_dir import check_repo_engines
    from trtspec.serving.docker import docker_command, repo_mounts

    check_repo_engines(path, image)  # engines only load in the TensorRT-LLM release that built them
    mounts, env = repo_mounts(path)
    cmd = docker_command(path, image, http_port=http, grpc_port=grpc, metrics_port=metrics, mounts=mounts, env=env)
    console.print(shlex.join(cmd), highlight=False, soft_wrap=True)
    if dry_run:
        return
    if shutil.which("docker") is None:
        raise ServerError(
            "no docker client on this machine",
            hint="run the command above where Docker and the NVIDIA container toolkit are installed, or use --dry-run",
        )
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)


def generate_remote(
    prompt: str,
    url: str,
    protocol: Protocol | None,
    max_tokens: int,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    num_draft_tokens: int | None,
    raw: bool,
    stream: bool,
    as_json: bool,
) -> None:
    """`trtspec generate --url`: one prompt through a served ensemble (the request is validated before it is sent)."""
    from trtspec.serving.client import TritonLLMClient

    options = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "seed": seed,
        "num_draft_tokens": num_draft_tokens,
        "apply_chat_template": not raw,
    }
    with TritonLLMClient(url, protocol=protocol.value if protocol else None) as client:
        from trtspec.serving.client import request_inputs

        request_inputs(prompt, max_tokens, stream, options)  # every rule, before the first byte goes out
        client.check_ready()
        bound = client.max_draft_len()
        if bound is not None:
            from trtspec.validation import validate_num_draft_tokens

            validate_num_draft_tokens(num_draft_tokens, bound)  # the deployment's max_draft_len, as in process
        show = stream and not as_json

        def on_text(t: str) -> None:
            sys.stdout.write(t)
            sys.stdout.flush()

        result = client.generate(prompt, max_tokens, stream=stream, on_text=on_text if show else None, **options)
    if as_json:
        print_json(result.to_dict())
        return
    if show:
        sys.stdout.write("\n")
    else:
        console.print(result.text, highlight=False, markup=False)
    mode = "target only" if num_draft_tokens == 0 else "speculative"
    table = Table(title=f"{mode}, served by {client.endpoint.url}", show_header=False)
    for key, value in result.stats.items():
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    table.add_row("latency_s", f"{result.latency_s:.3f}")
    err_console.print(table)


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
    url: Annotated[Optional[str], typer.Option("--url", help="Triton, HOST:PORT (see --protocol)")] = None,
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
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="tokens per request")] = 64,
    requests: Annotated[
        int,
        typer.Option("--requests", help="requests per level and mode (default: 2x concurrency, or 10 s of arrivals)"),
    ] = 0,
    draft_len: Annotated[
        Optional[str],
        typer.Option("--draft-len", "-k", help="sweep K per request, e.g. 1,2,4,8 (default: the deployment's)"),
    ] = None,
    no_baseline: Annotated[bool, typer.Option("--no-baseline", help="skip the target-only run")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="do not apply the chat template")] = False,
    seed: Annotated[int, typer.Option("--seed", help="seed of synthetic prompts and arrivals")] = 0,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write a PNG of the results")] = None,
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
    ks = _numbers("--draft-len", draft_len, int, 1) if draft_len is not None else None
    requester: OpenAIRequester | TritonRequester
    if openai is not None:
        requester = OpenAIRequester(openai)
    else:
        assert url is not None  # exactly one of --url and --openai (checked above)
        requester = TritonRequester(url, protocol.value if protocol else None)
    try:
        results = run_bench(
            requester,
            workload,
            levels,
            load=load,
            draft_lens=ks,
            baseline=not no_baseline,
            chat=not raw,
            requests_per_level=requests or None,
            seed=seed,
            progress=None if as_json else err_console,
        )
    finally:
        requester.close()
    if plot is not None:
        plot_results(results, plot)
    verdict = _verdict(results, max_tokens)
    if as_json:
        print_json({**results, "verdict": verdict})
        return
    for w in results["warnings"]:
        err_console.print(f"[yellow]warning:[/] {w}")
    console.print(render_table(results))
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
    app.command()(repo)
    app.command()(serve)
    app.command()(bench)
