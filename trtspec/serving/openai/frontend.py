"""The OpenAI-compatible frontend's lifecycle: uvicorn serving the app on a thread of the process that owns Triton.

``trtspec serve REPO --openai-port PORT`` starts it once Triton is ready and stops it before Triton: both live in one
process tree (Triton is its child with PR_SET_PDEATHSIG, the frontend a thread), so they stop together and neither
outlives the other. In a container whose entrypoint runs tritonserver itself, ``python -m trtspec.serving.openai``
runs the same frontend as its own process next to it (docker/entrypoint.sh).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from trtspec.errors import ServerError

API_KEY_ENV = "TRTSPEC_API_KEY"  # the server's key; not OPENAI_API_KEY, which is a client's key for OpenAI itself


def build_service(
    repo: Path, triton_grpc_url: str, served_model_name: str | None = None, max_body_bytes: int | None = None
) -> Any:
    """The endpoints' logic for ``repo`` served by the Triton server at ``triton_grpc_url``."""
    from trtspec.errors import require

    for module in ("starlette", "uvicorn", "tritonclient"):
        require(module, "serve")
    from trtspec.serving.openai.app import OpenAIService
    from trtspec.serving.openai.backend import DirectBackend, TritonBackend
    from trtspec.serving.openai.deployment import ServedDeployment
    from trtspec.serving.openai.text import PromptTokenizer

    deployment = ServedDeployment.from_repo(repo, served_model_name)
    tokenizer = PromptTokenizer(deployment.tokenizer_dir, deployment.add_special_tokens)
    if tokenizer.has_chat_template:  # load the template engine now, not on the first request
        require("transformers", "torch")  # renders chat templates (as the preprocessing model does)
        tokenizer.chat_prompt([{"role": "user", "content": "hello"}])
    if deployment.draft_target_model:  # ensemble repositories: straight to the draft-target model (cancellable)
        backend: TritonBackend = DirectBackend(
            triton_grpc_url, deployment.draft_target_model, deployment.tokenizer_dir, deployment.add_special_tokens
        )
    else:
        backend = TritonBackend(triton_grpc_url, deployment.entry_model, deployment.contract)
    service = OpenAIService(deployment, backend, tokenizer)
    if max_body_bytes is not None:
        if max_body_bytes < 1024:
            raise ServerError(
                f"the body-size limit must be at least 1024 bytes, got {max_body_bytes}",
                hint="a chat request with a short prompt is a few hundred bytes",
            )
        import dataclasses

        service.limits = dataclasses.replace(service.limits, max_body_bytes=max_body_bytes)
    return service


def bind(host: str, port: int | None) -> socket.socket:
    """A listening socket on host:port (``None`` or 0: a free port), or ServerError when the port is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port or 0))
    except OSError as exc:
        sock.close()
        raise ServerError(
            f"OpenAI port {port} on {host} cannot be used ({exc.strerror})",
            hint="pass another --openai-port, or 0 to pick a free one",
        ) from None
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


class OpenAIFrontend:
    """The OpenAI-compatible server for ``repo`` in front of Triton at ``triton_grpc_url`` (host:port).

    ``with OpenAIFrontend(repo, server.grpc_url) as front: front.base_url`` -- on a background thread of this process.
    """

    def __init__(
        self,
        repo: Path,
        triton_grpc_url: str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str | None = None,
        start_timeout_s: float = 30.0,
        api_key: str | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        self.repo = Path(repo)
        self.triton_grpc_url = triton_grpc_url
        self.host = host
        self.requested_port = port
        self.served_model_name = served_model_name
        self.start_timeout_s = start_timeout_s
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.service: Any = None
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._sock: socket.socket | None = None
        self._app: Any = None

    @property
    def base_url(self) -> str:
        local = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{local}:{self.port}/v1"

    def prepare(self) -> OpenAIFrontend:
        """Read the repository, load the tokenizer and bind the port (fails fast, before Triton is started)."""
        if self._sock is None:
            self.service = build_service(self.repo, self.triton_grpc_url, self.served_model_name, self.max_body_bytes)
            from trtspec.serving.openai.app import create_app

            self._app = create_app(self.service, self.api_key)
            self._sock = bind(self.host, self.requested_port)
            self.port = int(self._sock.getsockname()[1])
        return self

    def start(self) -> OpenAIFrontend:
        """Start serving (after ``prepare``) and return once it accepts requests (or raise ServerError)."""
        import uvicorn

        if self._thread is not None:
            raise ServerError("this OpenAI frontend is already started", hint="stop() it first")
        self.prepare()
        sock = self._sock
        assert sock is not None  # prepare() bound it
        config = uvicorn.Config(
            self._app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5
        )
        self._server = uvicorn.Server(config)

        def run() -> None:
            try:
                self._server.run(sockets=[sock])
            except BaseException as exc:  # noqa: BLE001 - reported by check()
                self._error = exc
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="trtspec-openai", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"the OpenAI frontend did not start on {self.host}:{self.port}"
                    + (f" ({self._error})" if self._error else ""),
                    hint="run with TRTSPEC_DEBUG=1 for details",
                )
            time.sleep(0.02)
        return self

    def check(self) -> None:
        """Raise ServerError when the frontend stopped serving on its own."""
        if self._thread is not None and not self._thread.is_alive():
            raise ServerError(
                f"the OpenAI frontend on port {self.port} stopped" + (f": {self._error}" if self._error else ""),
                hint="run with TRTSPEC_DEBUG=1 for details",
            )

    def start_drain(self) -> None:
        """From now on: /v1 requests get 503 with Retry-After, /health says not ready; streams in flight go on."""
        if self.service is not None:
            self.service.draining = True

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, let open responses end (a few seconds), stop."""
        thread, self._thread = self._thread, None
        if thread is None and self._sock is not None:  # prepared, never started
            self._sock.close()
        self._sock = None
        if self._server is not None:
            self._server.should_exit = True
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                thread.join(5.0)

    def __enter__(self) -> OpenAIFrontend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
