"""Progress for long work: a live bar on a terminal, timestamped lines in a log (no TTY: CI, nohup, docker logs).

Both are ``rich.progress.Progress`` objects, so stage bodies call the same ``add_task`` / ``advance`` / ``update`` /
``remove_task``. Without a terminal, rich draws nothing until the end; ``LogProgress`` prints a line when a task starts,
when it finishes, and in between at most every ``TRTSPEC_PROGRESS_SECONDS`` (default 10) per task, so an 11-minute
calibration shows every batch that takes longer than that.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rich.console import Console
from rich.progress import Progress, TaskID


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("TRTSPEC_PROGRESS_SECONDS", "10")))
    except ValueError:
        return 10.0


class LogProgress(Progress):
    """A Progress that draws no bar and logs task lines instead (see the module docstring)."""

    def __init__(self, console: Console, interval_s: float | None = None) -> None:
        super().__init__(console=console, disable=True)
        self.interval_s = _interval() if interval_s is None else interval_s
        self._t0 = time.monotonic()
        self._last: dict[TaskID, float] = {}
        self._done: set[TaskID] = set()

    def _line(self, task_id: TaskID, event: str = "") -> None:
        task = self._tasks.get(task_id)
        if task is None:
            return
        count = (
            f"{int(task.completed)}/{int(task.total)}"
            if task.total
            else (f"{int(task.completed)}" if task.completed else "")
        )
        pct = f" ({100 * task.completed / task.total:.0f}%)" if task.total else ""
        elapsed = time.monotonic() - self._t0
        stamp = f"[{int(elapsed // 60):02d}:{elapsed % 60:04.1f}]"
        self.console.print(
            f"{stamp} {task.description}: {event or count + pct}".rstrip(": "),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        self._last[task_id] = time.monotonic()

    def _maybe(self, task_id: TaskID) -> None:
        task = self._tasks.get(task_id)
        if task is None or task_id in self._done:
            return
        if task.total is not None and task.completed >= task.total:
            self._done.add(task_id)
            self._line(task_id)
        elif time.monotonic() - self._last.get(task_id, 0.0) >= self.interval_s:
            self._line(task_id)

    def add_task(
        self,
        description: str,
        start: bool = True,
        total: float | None = 100.0,
        completed: int = 0,
        visible: bool = True,
        **fields: Any,
    ) -> TaskID:
        task_id = super().add_task(
            description, start=start, total=total, completed=completed, visible=visible, **fields
        )
        self._line(task_id, "started" + (f", {int(total)} steps" if total else ""))
        return task_id

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._maybe(task_id)

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        super().update(task_id, **kwargs)
        if kwargs.get("total") is not None:
            self._done.discard(task_id)
        if any(kwargs.get(k) is not None for k in ("total", "completed", "advance")):
            self._maybe(task_id)
        elif kwargs.get("description") and time.monotonic() - self._last.get(task_id, 0.0) >= self.interval_s:
            self._line(task_id)

    def remove_task(self, task_id: TaskID) -> None:
        if task_id not in self._done:
            self._line(task_id, "done")
        super().remove_task(task_id)


def make_progress(*columns: Any, console: Console, transient: bool = False, disable: bool = False) -> Progress:
    """A live bar on a terminal; log lines when ``console`` is not one; nothing at all with ``disable``."""
    if disable:
        return Progress(*columns, console=console, disable=True)
    if not console.is_terminal:
        return LogProgress(console)
    return Progress(*columns, console=console, transient=transient)
