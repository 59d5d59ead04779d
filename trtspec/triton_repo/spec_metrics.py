"""Acceptance on production traffic: the draft-target models' speculation counters on Triton's ``/metrics``.

The torch runtime's in-process model and the BLS orchestrator record every finished request's ``SpecStats`` here,
through the Python backend's custom metrics (``pb_utils.MetricFamily``; they appear on Triton's metrics port next to
its own ``nv_*`` families). Counters, labelled by model and drafter: proposed and accepted draft tokens, target steps,
steps that verified no draft token, output tokens, requests, and target steps by draft length (``draft_len``: the K
of the step, 0 for a plain step). Acceptance = accepted / proposed and tokens per target step = output / steps are
ratios of counters, as Prometheus computes them (``rate(a) / rate(b)``); ``trtspec bench`` reads them before and after
a run (trtspec.serving.bench).
"""

from __future__ import annotations

from typing import Any

from trtspec.speculative.rules import MAX_DRAFT_LEN, SpecStats

PREFIX = "trtspec_"
COUNTERS = {
    "draft_tokens_total": "draft tokens proposed",
    "accepted_draft_tokens_total": "draft tokens the target accepted",
    "target_steps_total": "target steps (decoding iterations)",
    "no_draft_steps_total": "target steps that verified no draft token (nothing proposed, or chosen not to)",
    "output_tokens_total": "tokens generated",
    "requests_total": "requests finished",
}
STEPS_BY_DRAFT_LEN = "steps_by_draft_len_total"


class SpeculationMetrics:
    """The counters of one model instance (see the module docstring). Without ``pb_utils`` (tests, no Triton) it
    only keeps the totals."""

    def __init__(self, pb_utils: Any, model: str, drafter: str) -> None:
        self.totals = {name: 0 for name in COUNTERS}
        self.by_len = [0] * (MAX_DRAFT_LEN + 1)
        self._metrics: dict[str, Any] = {}
        self._by_len: list[Any] = []
        self._families: list[Any] = []  # a family deleted before its metrics takes them off /metrics: keep them
        if pb_utils is None or not hasattr(pb_utils, "MetricFamily"):
            return
        try:
            self._register(pb_utils.MetricFamily, {"model": model, "drafter": drafter})
        except Exception as exc:  # noqa: BLE001 - metrics must never stop a model from serving
            self._metrics, self._by_len, self._families = {}, [], []
            print(f"[trtspec] {model}: speculation metrics unavailable ({exc})", flush=True)

    def _register(self, family: Any, labels: dict[str, str]) -> None:
        # Every instance of a model registers the same families and labels; Triton shares them (one counter).
        for name, doc in COUNTERS.items():
            fam = family(name=PREFIX + name, description=doc, kind=family.COUNTER)
            self._families.append(fam)
            self._metrics[name] = fam.Metric(labels=labels)
        fam = family(
            name=PREFIX + STEPS_BY_DRAFT_LEN, description="target steps by their draft length K", kind=family.COUNTER
        )
        self._families.append(fam)
        self._by_len = [fam.Metric(labels={**labels, "draft_len": str(k)}) for k in range(MAX_DRAFT_LEN + 1)]

    def record(self, stats: SpecStats) -> None:
        """Add one finished request's statistics."""
        values = {
            "draft_tokens_total": stats.total_draft_tokens,
            "accepted_draft_tokens_total": stats.total_accepted_draft_tokens,
            "target_steps_total": stats.target_steps,
            "no_draft_steps_total": stats.no_draft_steps,
            "output_tokens_total": stats.num_output_tokens,
            "requests_total": 1,
        }
        for name, v in values.items():
            if v:
                self.totals[name] += v
                metric = self._metrics.get(name)
                if metric is not None:
                    metric.increment(float(v))
        for k, n in stats.steps_by_draft_len.items():
            k = min(int(k), MAX_DRAFT_LEN)
            self.by_len[k] += n
            if self._by_len:
                self._by_len[k].increment(float(n))


def parse_scrape(text: str) -> dict[str, float]:
    """The trtspec counters of a Prometheus text scrape, summed over labels: ``{"draft_tokens_total": ..., ...,
    "steps_by_draft_len_total{k}": ...}`` (what ``trtspec bench`` compares before and after a run)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        name, _, rest = line.partition("{")
        value = line.rsplit(" ", 1)[-1]
        key = name[len(PREFIX) :].strip()
        if key == STEPS_BY_DRAFT_LEN and 'draft_len="' in rest:
            key += "{" + rest.split('draft_len="', 1)[1].split('"', 1)[0] + "}"
        try:
            out[key] = out.get(key, 0.0) + float(value)
        except ValueError:
            continue
    return out
