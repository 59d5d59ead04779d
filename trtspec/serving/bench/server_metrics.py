"""What the server measured during a bench run: the speculation counters on its ``/metrics`` (Triton's metrics port,
or the OpenAI frontend's), scraped before and after, as acceptance, tokens per target step, the share of steps that
did not speculate, and the draft lengths chosen (trtspec.triton_repo.spec_metrics writes them)."""

from __future__ import annotations

import urllib.request
from typing import Any

from trtspec.errors import GenerationError
from trtspec.triton_repo.spec_metrics import STEPS_BY_DRAFT_LEN, parse_scrape


def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
    """The trtspec counters at ``url`` (``http://HOST:8002/metrics``), summed over models and drafters."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return parse_scrape(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError) as exc:
        raise GenerationError(
            f"cannot read metrics at {url}: {exc}", hint="Triton's metrics port, e.g. http://127.0.0.1:8002/metrics"
        ) from None


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The run's share of the counters, as the figures a reader wants."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}
    steps = d.get("target_steps_total", 0.0)
    drafted = d.get("draft_tokens_total", 0.0)
    by_len = {
        int(k.split("{", 1)[1].rstrip("}")): int(v)
        for k, v in d.items()
        if k.startswith(STEPS_BY_DRAFT_LEN + "{") and v > 0
    }
    return {
        "requests": int(d.get("requests_total", 0)),
        "target_steps": int(steps),
        "acceptance_rate": round(d.get("accepted_draft_tokens_total", 0.0) / drafted, 4) if drafted else None,
        "tokens_per_step": round(d.get("output_tokens_total", 0.0) / steps, 4) if steps else None,
        "no_draft_share": round(d.get("no_draft_steps_total", 0.0) / steps, 4) if steps else None,
        "steps_by_draft_len": dict(sorted(by_len.items())),
    }


def describe(m: dict[str, Any]) -> str:
    """One line for the bench output."""
    if not m.get("target_steps"):
        return "server metrics: no speculative steps counted (is --metrics the serving server's /metrics?)"
    acc = "n/a" if m["acceptance_rate"] is None else f"{m['acceptance_rate']:.2f}"
    lens = ", ".join(f"K{k}: {n}" for k, n in m["steps_by_draft_len"].items())
    return (
        f"server metrics over the run: {m['requests']} requests, {m['target_steps']} target steps, acceptance {acc}, "
        f"{m['tokens_per_step']:.2f} tokens per target step, {100 * m['no_draft_share']:.0f} % of steps without a "
        f"draft; steps by K: {lens}"
    )
