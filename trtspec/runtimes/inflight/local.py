"""Engines in this process behind the orchestrator's EngineClient interface (tests, and the benchmark's baseline
without Triton)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import torch

from trtspec.runtimes.inflight.contract import RowRequest, job_from_row
from trtspec.runtimes.inflight.engine import InflightEngine


class LocalEngines:
    """``generate(model, row)`` on in-process InflightEngines, keyed by model name."""

    def __init__(self, engines: Mapping[str, InflightEngine]) -> None:
        self.engines = dict(engines)

    async def generate(self, model: str, row: RowRequest) -> AsyncIterator[tuple[list[int], Any]]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[tuple[list[int], Any, bool] | Exception] = asyncio.Queue()

        def on_tokens(new: list[int], logits: torch.Tensor | None, final: bool) -> None:
            loop.call_soon_threadsafe(q.put_nowait, (new, None if logits is None else logits.cpu().numpy(), final))

        def on_error(exc: Exception) -> None:
            loop.call_soon_threadsafe(q.put_nowait, exc)

        self.engines[model].submit(job_from_row(row, on_tokens, on_error))
        while True:
            item = await q.get()
            if isinstance(item, Exception):
                raise item
            new, logits, final = item
            yield new, logits
            if final:
                return
