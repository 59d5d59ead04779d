"""`trtspec serve`: tritonserver on a model repository (here or in docker) until Ctrl-C, then drain."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from trtspec.cli._common import console, err_console
from trtspec.errors import ServerError

POST_DRAIN_STOP_S = 5.0
RepoArg = Annotated[Optional[Path], typer.Argument(help="model repository; omitted: ./triton_repo", show_default=False)]


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
    api_key: Annotated[
        Optional[str],
        typer.Option(
            "--api-key",
            envvar="TRTSPEC_API_KEY",
            show_envvar=True,
            help="with --openai-port: every /v1 request must send 'Authorization: Bearer KEY' (/health, /metrics "
            "and /version stay open)",
        ),
    ] = None,
    max_body_bytes: Annotated[
        Optional[int],
        typer.Option(
            "--max-body-bytes", help="with --openai-port: larger request bodies get 413 (default 4 MiB)", min=1024
        ),
    ] = None,
) -> None:
    """Serve a model repository with tritonserver until Ctrl-C (or SIGTERM), then drain: new requests are refused,
    in-flight ones finish (cut with an error at --drain-timeout). The server never outlives this."""
    path = (repo_path or Path("triton_repo")).resolve()
    _require_repository(path)  # before anything is started or written (the log included)
    given_key = api_key is not None and api_key != os.environ.get("TRTSPEC_API_KEY")  # on the command line
    if openai_port is None and (given_key or max_body_bytes is not None):
        raise ServerError(
            "--api-key and --max-body-bytes apply to the OpenAI-compatible API, which is not served",
            hint="add --openai-port PORT (0 picks a free one)",
        )
    if docker is not None:
        if openai_port is not None:
            raise ServerError(
                "--openai-port does not apply with --docker (the plain tritonserver image has no frontend)",
                hint="run the trtspec image (docker/), which serves the OpenAI API on 9000",
            )
        _serve_docker(path, docker, host, (http_port, grpc_port, metrics_port), dry_run)
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

            front = OpenAIFrontend(
                path,
                server.grpc_url,
                host=host,
                port=openai_port or None,
                api_key=api_key,
                max_body_bytes=max_body_bytes,
            ).prepare()
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
            if front is not None:
                front.start_drain()  # 503 with Retry-After for new /v1 requests, /health not ready
            result = server.drain(drain_timeout, abort=lambda: len(signals) > 1)
            err_console.print(result.line() if len(signals) < 2 else "stopping now (second signal)")
            # Nothing is left in flight: a Triton that has not exited a few seconds after SIGINT hangs in its own
            # shutdown (seen on 2.51), so it gets SIGTERM then SIGKILL sooner.
            server.stop_timeout_s = min(server.stop_timeout_s, POST_DRAIN_STOP_S)
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


def _serve_docker(path: Path, image: str, host: str, ports: tuple[int, int, int], dry_run: bool) -> None:
    import shlex
    import shutil

    from trtspec.serving.docker import docker_command, repo_mounts
    from trtspec.serving.server import free_port
    from trtspec.trtllm.engine_dir import check_repo_engines

    check_repo_engines(path, image)  # engines only load in the TensorRT-LLM release that built them
    from trtspec.serving.container_paths import docker_form, path_problems

    problems = path_problems(path, docker_form(path, image))  # what the configs name exists under the -v mounts
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ServerError(
            problems[0] + more,
            hint="rebuild what it names (`trtspec build`), or rewrite the repository (`trtspec repo`) on this machine",
        )
    mounts, env = repo_mounts(path)
    chosen: list[int] = []
    for port in ports:  # 0: a port free now on the publishing address
        while port == 0 or port in chosen:
            try:
                port = free_port("" if host == "0.0.0.0" else host)
            except OSError as exc:
                raise ServerError(
                    f"cannot pick a free port on {host} ({exc.strerror})", hint="give the ports, or another --host"
                ) from None
        chosen.append(port)
    http, grpc, metrics = chosen
    cmd = docker_command(
        path, image, http_port=http, grpc_port=grpc, metrics_port=metrics, mounts=mounts, env=env, host=host
    )
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


def register(app: typer.Typer) -> None:
    app.command()(serve)
