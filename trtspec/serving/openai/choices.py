"""The ``n`` choices of one OpenAI request: each one sequence of its own on the server, run concurrently, their
pieces merged as they arrive, their usage and speculation statistics combined."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any


def choice_values(values: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The request fields of each of ``n`` choices: choice i seeded ``seed + i`` when the request has a seed
    (reproducible, and different choices); without a seed each sequence draws its own; greedy choices are alike,
    as OpenAI's."""
    seed = values.get("seed")
    if n == 1 or seed is None:
        return [values] * n
    return [{**values, "seed": (seed + i) % 2**64} for i in range(n)]


def combined(finished: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(usage, speculative statistics) of a request from its choices' (finish_reason, usage, statistics): the
    prompt once and the completions summed (OpenAI's usage), draft tokens summed; one choice's as they are."""
    if len(finished) == 1:
        return finished[0][1], finished[0][2]
    prompt = finished[0][1]["prompt_tokens"]
    completion = sum(u["completion_tokens"] for _, u, _ in finished)
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    specs = [s for _, _, s in finished]
    spec = dict(specs[0])
    if spec["total_draft_tokens"] is not None:
        drafted = sum(s["total_draft_tokens"] or 0 for s in specs)
        accepted = sum(s["total_accepted_draft_tokens"] or 0 for s in specs)
        spec.update(
            total_draft_tokens=drafted,
            total_accepted_draft_tokens=accepted,
            acceptance_rate=round(accepted / drafted, 6) if drafted else 0.0,
        )
    return usage, spec


async def gather_all(coros: Any) -> list[Any]:
    """The results of the choices' coroutines, run concurrently; the first error cancels the others."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()


@asynccontextmanager
async def merged(streams: list[Any]) -> AsyncIterator[AsyncIterator[tuple[int, Any]]]:
    """The pieces of several choices' streams as (choice index, piece) in the order they arrive; the first error is
    raised where it is read, and leaving closes every stream (which cancels their Triton requests)."""
    if len(streams) == 1:  # one choice: its own stream, no task

        async def one() -> AsyncGenerator[tuple[int, Any], None]:
            async for piece in streams[0]:
                yield 0, piece

        async with aclosing(one()) as it:
            yield it
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()
    end = object()

    async def pump(i: int, stream: Any) -> None:
        try:
            async with aclosing(stream) as s:
                async for piece in s:
                    await queue.put((i, piece, None))
            await queue.put((i, end, None))
        except Exception as exc:  # noqa: BLE001 - handed to the reader
            await queue.put((i, end, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]

    async def read() -> AsyncGenerator[tuple[int, Any], None]:
        left = len(streams)
        while left:
            i, piece, exc = await queue.get()
            if exc is not None:
                raise exc
            if piece is end:
                left -= 1
                continue
            yield i, piece

    try:
        async with aclosing(read()) as it:
            yield it
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
