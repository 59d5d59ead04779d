"""A health probe that fails when generation is broken, not only when a port is down: one 1-token request, with a
deadline. Triton 2.51 keeps every health endpoint at 200 after a Python stub died (trtspec.serving.stubs); a request
routed to the dead stub fails or never returns. Used by `trtspec probe` (the Kubernetes exec probes)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from trtspec.errors import ServerError, TrtspecError
from trtspec.triton_repo.names import ENSEMBLE

PROBE_PROMPT = "ping"


@dataclass(frozen=True)
class ProbeResult:
    url: str
    protocol: str
    model: str
    latency_s: float
    tokens: int


def probe(url: str, *, protocol: str | None = None, model: str = ENSEMBLE, timeout_s: float = 10.0) -> ProbeResult:
    """Generate one token from ``model`` at ``url`` within ``timeout_s``; ServerError (with why) otherwise."""
    from trtspec.serving.client import TritonLLMClient
    from trtspec.serving.endpoints import parse_url

    endpoint = parse_url(url, protocol)
    where = f"{endpoint.protocol}://{endpoint.address}"
    t0 = time.monotonic()
    try:
        with TritonLLMClient(url, protocol=protocol, model=model, timeout_s=timeout_s) as client:
            client.check_ready()  # a port that is down or not Triton: said as such
            result = client.generate(PROBE_PROMPT, 1)
    except TrtspecError as exc:
        raise ServerError(
            f"probe of {where} ({model}) failed after {time.monotonic() - t0:.1f} s: {exc.message}",
            hint="is the server up? its log says why generation fails",
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever breaks the request breaks the probe
        raise ServerError(
            f"probe of {where} ({model}) failed: {type(exc).__name__}: {exc}",
            hint="is the server running? check host, port and --protocol",
        ) from None
    return ProbeResult(
        endpoint.address,
        endpoint.protocol,
        model,
        time.monotonic() - t0,
        int(result.stats.get("num_output_tokens", len(result.chunks))),
    )
