"""Engines in this process behind the orchestrator's EngineClient interface (tests, and the benchmark's baseline
without Triton)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import torch

from trtspec.engines.inflight.engine import InflightEngine
from trtspec.engines.inflight.jobs import Job
from trtspec.engines.torch_runtime.sampling import SamplingParams


class LocalEngines:
    """``generate(model, ...)`` on in-process InflightEngines, keyed by model name."""

    def __init__(self, engines: Mapping[str, InflightEngine]) -> None:
        self.engines = dict(engines)

    async def generate(self, model: str, tokens: list[int], max_new: int, params: Any, *,
                       draft: list[int] | None = None, draft_logits: Any = None, stream: bool = False,
                       want_logits: bool = False) -> AsyncIterator[tuple[list[int], Any]]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[tuple[list[int], Any, bool] | Exception] = asyncio.Queue()

        def on_tokens(new: list[int], logits: torch.Tensor | None, final: bool) -> None:
            loop.call_soon_threadsafe(q.put_nowait, (new, None if logits is None else logits.numpy(), final))

        def on_error(exc: Exception) -> None:
            loop.call_soon_threadsafe(q.put_nowait, exc)

        job = Job(tokens=list(tokens), max_new=max_new, on_tokens=on_tokens, on_error=on_error,
                  sampling=SamplingParams(params.temperature, params.top_k, params.top_p, params.seed),
                  end_id=params.end_id, draft=draft,
                  draft_logits=None if draft_logits is None else torch.from_numpy(np.asarray(draft_logits)),
                  stop_words=params.stop_words, bad_words=params.bad_words, stream=stream,
                  return_logits=want_logits)
        self.engines[model].submit(job)
        while True:
            item = await q.get()
            if isinstance(item, Exception):
                raise item
            new, logits, final = item
            yield new, logits
            if final:
                return
