"""Where a served model is (``[grpc://|http://|https://]HOST[:PORT]``) and what a failed connection means."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtspec.errors import GenerationError, ServerError

PROTOCOLS = ("grpc", "http")
DEFAULT_PORTS = {"grpc": 8001, "http": 8000}
_SCHEMES = {"grpc": ("grpc", False), "http": ("http", False), "https": ("http", True)}


@dataclass(frozen=True)
class Endpoint:
    """Where a served model is: protocol (grpc | http), host, port, and TLS (https)."""

    protocol: str
    host: str
    port: int
    tls: bool = False

    @property
    def address(self) -> str:
        """host:port (an IPv6 host in brackets), as tritonclient takes it."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else self.protocol}://{self.address}"


def parse_url(url: str, protocol: str | None = None) -> Endpoint:
    """``[grpc://|http://|https://]HOST[:PORT]``: the scheme names the protocol (a conflicting ``protocol`` is an
    error); without one, ``protocol`` or gRPC. A missing port is the protocol's default (gRPC 8001, HTTP 8000)."""
    from urllib.parse import urlsplit

    text = url.strip()
    if not text:
        raise GenerationError("--url is empty", hint="e.g. --url 127.0.0.1:8001 or --url http://127.0.0.1:8000")
    if protocol is not None and protocol not in PROTOCOLS:
        raise GenerationError(f"unknown protocol {protocol!r}", hint="grpc or http")
    scheme = text.split("://", 1)[0].lower() if "://" in text else None
    if scheme is not None and scheme not in _SCHEMES:
        raise GenerationError(
            f"--url {url}: unsupported scheme {scheme}://",
            hint="use grpc://, http:// or https://, or HOST:PORT for gRPC",
        )
    proto, tls = _SCHEMES[scheme] if scheme else (protocol or "grpc", False)
    if scheme and protocol is not None and protocol != proto:
        raise GenerationError(
            f"--url {url} is {proto.upper()} but --protocol is {protocol}",
            hint="drop --protocol (the scheme decides), or change the scheme",
        )
    parts = urlsplit(text if scheme else f"//{text}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise GenerationError(
            f"--url {url}: expected [SCHEME://]HOST[:PORT], with no path", hint="the client adds Triton's paths itself"
        )
    try:
        port = parts.port
    except ValueError:
        raise GenerationError(f"--url {url}: the port is not a number in 1..65535", hint="e.g. HOST:8001") from None
    if not parts.hostname:
        raise GenerationError(f"--url {url}: no host", hint="e.g. 127.0.0.1:8001")
    return Endpoint(proto, parts.hostname, port or DEFAULT_PORTS[proto], tls)


def probe(endpoint: Endpoint, timeout_s: float = 5.0) -> None:
    """Raise ServerError unless something accepts TCP connections at the endpoint."""
    import socket

    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s):
            return
    except ConnectionRefusedError:
        raise ServerError(
            f"nothing is listening at {endpoint.address} (connection refused)",
            hint="start the server with `trtspec serve`, or check host and port (by default gRPC 8001, HTTP 8000)",
        ) from None
    except socket.gaierror:
        raise ServerError(f"cannot resolve host {endpoint.host!r}", hint="check the host name in --url") from None
    except (TimeoutError, socket.timeout):
        raise ServerError(
            f"no answer from {endpoint.address} within {timeout_s:.0f} s (connection timed out)",
            hint="check host, port and firewall",
        ) from None
    except OSError as exc:
        raise ServerError(
            f"cannot connect to {endpoint.address} ({exc.strerror or exc})", hint="check host and port"
        ) from None


_DROPPED = ("socket closed", "connection reset", "broken pipe", "stream removed", "rst_stream", "eof")


def stream_error(error: Any, where: str) -> Exception:
    """The error a failed response maps to: a dropped connection is the server's (ServerError), anything else a
    refusal of this request (GenerationError)."""
    message = error.message() if callable(getattr(error, "message", None)) else str(error)
    status = str(error.status()) if callable(getattr(error, "status", None)) else ""
    if any(s in status for s in ("UNAVAILABLE", "CANCELLED")) or any(s in message.lower() for s in _DROPPED):
        return ServerError(
            f"the server at {where} dropped the connection mid-request ({message})",
            hint="the server stopped or a model crashed: its log (trtspec serve --log-file) says why",
        )
    return GenerationError(f"server: {message}", hint="the server refused this request; its log has details")
