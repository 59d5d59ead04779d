"""``python -m trtspec.serving.openai --repo DIR --triton HOST:PORT --port PORT``: the OpenAI-compatible frontend as
its own process, next to a tritonserver started by someone else (the container entrypoint, docker/entrypoint.sh).

It answers /health with 503 until Triton is ready, and exits when SIGTERM / SIGINT arrives (uvicorn's handlers).
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
    args = parser.parse_args(argv)

    import uvicorn

    from trtspec.errors import TrtspecError
    from trtspec.serving.openai.app import create_app
    from trtspec.serving.openai.frontend import bind, build_service

    try:
        service = build_service(args.repo, args.triton, args.served_model_name)
        sock = bind(args.host, args.port)
    except TrtspecError as exc:
        print(f"error: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return 1
    print(
        f"OpenAI-compatible API for {service.deployment.name!r} on http://{args.host}:{sock.getsockname()[1]}/v1 "
        f"(Triton at {args.triton})",
        flush=True,
    )
    uvicorn.Server(
        uvicorn.Config(create_app(service), log_level="warning", access_log=False, timeout_graceful_shutdown=5)
    ).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
