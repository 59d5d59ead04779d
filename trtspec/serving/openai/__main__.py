"""``python -m trtspec.serving.openai --repo DIR --triton HOST:PORT --port PORT``: the OpenAI-compatible frontend as
its own process, next to a tritonserver started by someone else (the container entrypoint, docker/entrypoint.sh).

It answers /health with 503 until Triton is ready, and exits when SIGTERM / SIGINT arrives (uvicorn's handlers).
SIGUSR1 starts a drain (the entrypoint sends it when the container is told to stop, before Triton drains): new /v1
requests get 503 with Retry-After and /health says not ready, while the streams in flight go on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtspec.serving.openai", description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="the model repository Triton serves")
    parser.add_argument("--triton", default="127.0.0.1:8001", help="Triton's gRPC address (host:port)")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=9000, help="port to listen on")
    parser.add_argument("--served-model-name", default=None, help="the model id (default: the spec's name)")
    parser.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 (default: $TRTSPEC_API_KEY)"
    )
    parser.add_argument("--max-body-bytes", type=int, default=None, help="larger request bodies get 413")
    args = parser.parse_args(argv)

    import os
    import signal

    import uvicorn

    from trtspec.errors import TrtspecError
    from trtspec.serving.openai.app import create_app
    from trtspec.serving.openai.frontend import API_KEY_ENV, bind, build_service

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        service = build_service(args.repo, args.triton, args.served_model_name, args.max_body_bytes)
        sock = bind(args.host, args.port)
    except TrtspecError as exc:
        print(f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return 1
    print(
        f"OpenAI-compatible API for {service.deployment.name!r} on http://{args.host}:{sock.getsockname()[1]}/v1 "
        f"(Triton at {args.triton}; API key {'required' if api_key else 'not required'})",
        flush=True,
    )

    def drain(_signum: int, _frame: object) -> None:
        service.draining = True

    signal.signal(signal.SIGUSR1, drain)
    uvicorn.Server(
        uvicorn.Config(create_app(service, api_key), log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    ).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
