"""The one stage runner: hash the inputs -> skip when the output is up to date -> write into a temporary sibling ->
stamp its manifest -> rename it into place.

`trtspec build` runs every stage of ``pipeline_stages`` through ``run_stage``; `trtspec quantize`, `trtspec repo` and
`trtspec distill` run their stage through it too, so an output means the same (and is skipped the same) whichever
command wrote it. ``StageResult`` is what any stage did, in one vocabulary: ``STATUSES``.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.build.artifacts import (
    atomic_dir,
    hash_inputs,
    is_up_to_date,
    read_manifest,
    tool_versions,
    write_manifest,
)
from trtspec.procs import pid_alive

Inputs = tuple[dict[str, Path | None], dict]
InputsFn = Callable[[], Inputs]
BodyFn = Callable[[Path, Any], dict | None]

PASSED, BUILT, SKIPPED, NOT_NEEDED = "passed", "built", "skipped", "not needed"
STATUSES = (PASSED, BUILT, SKIPPED, NOT_NEEDED)
UP_TO_DATE = "up to date"  # the detail of every skipped stage, and how `trtspec quantize` words a skip
TOOLS = ("trtspec", "torch", "transformers", "nvidia-modelopt", "tritonclient", "nvidia-pytriton")


@dataclass
class PlanEntry:
    """How a stage describes itself to `trtspec plan`: what it does, what it reads, the external commands."""

    action: str
    inputs: list[str]
    commands: list[list[str]] = field(default_factory=list)


@dataclass
class Stage:
    """One stage: its output directory and the functions behind it.

    ``inputs`` gives the paths and settings whose hash decides whether ``output`` is up to date (``inputs_hash``,
    when given, is that hash computed by the caller); ``body`` writes the output into the temporary directory it is
    given and returns extra manifest fields. ``run`` replaces all of it for a stage with its own rule (check,
    quality). ``not_needed`` says why the stage does nothing for this spec. ``describe`` is the stage's plan entry.
    """

    name: str
    output: Path | None
    inputs: InputsFn | None = None
    body: BodyFn | None = None
    not_needed: str | None = None
    run: Callable[[bool, Any], StageResult] | None = None
    describe: Callable[[], PlanEntry] | None = None
    inputs_hash: str | None = None
    complete: Callable[[Path], bool] | None = None  # more than the manifest that an up-to-date output must hold


@dataclass
class StageResult:
    name: str
    status: str  # one of STATUSES
    output: str | None = None
    seconds: float = 0.0
    detail: str = ""
    manifest: dict | None = None

    @property
    def role(self) -> str:
        """The role of a per-role stage (``quantize:draft`` -> ``draft``)."""
        return self.name.partition(":")[2]

    @property
    def path(self) -> Path | None:
        return Path(self.output) if self.output is not None else None

    @property
    def words(self) -> str:
        """The status as `trtspec quantize` prints it ("up to date" for a skip)."""
        return UP_TO_DATE if self.status == SKIPPED else self.status

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "output": self.output,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }


def is_current(stage: Stage, inputs_hash: str) -> bool:
    """True when the stage's output holds a completed output made from inputs with this hash."""
    assert stage.output is not None
    return is_up_to_date(stage.output, inputs_hash) and (stage.complete is None or stage.complete(stage.output))


def run_stage(stage: Stage, force: bool = False, progress: Any = None) -> StageResult:
    """Run one stage: skipped when its output is up to date (unless ``force``), else written atomically with its
    manifest. Temporaries that killed runs left next to the output are removed first."""
    t0 = time.monotonic()
    if stage.not_needed is not None:
        return StageResult(stage.name, NOT_NEEDED, None, 0.0, stage.not_needed)
    if stage.run is not None:
        return stage.run(force, progress)
    assert stage.output is not None and stage.inputs is not None and stage.body is not None
    paths, settings = stage.inputs()
    inputs_hash = stage.inputs_hash or hash_inputs(paths, settings)
    if not force and is_current(stage, inputs_hash):
        return StageResult(
            stage.name, SKIPPED, str(stage.output), time.monotonic() - t0, UP_TO_DATE, read_manifest(stage.output)
        )
    clean_stale_temporaries([stage.output])
    started = time.time()
    with atomic_dir(stage.output) as tmp:
        extras = stage.body(tmp, progress) or {}
        manifest = {
            **extras,  # first: a body's fields never overwrite the hash the skip decision reads
            "stage": stage.name,
            "inputs_hash": inputs_hash,
            "inputs": {k: str(v) if v is not None else None for k, v in paths.items()},
            "settings": settings,
            "started_at": started,
            "finished_at": time.time(),
            "seconds": round(time.monotonic() - t0, 3),
            "tools": tool_versions(*TOOLS),
        }
        write_manifest(tmp, manifest)
    return StageResult(stage.name, BUILT, str(stage.output), time.monotonic() - t0, "", manifest)


def clean_stale_temporaries(outputs: Iterable[Path]) -> list[Path]:
    """Remove the ``.tmp-<name>-<pid>-*`` / ``.old-<name>-<pid>-*`` siblings (``atomic_dir``'s) that killed runs left
    next to these outputs; never those of a process still running. Returns what was removed."""
    removed: list[Path] = []
    for out in outputs:
        out = Path(out)
        if not out.parent.is_dir():
            continue
        for p in out.parent.iterdir():
            for prefix in (f".tmp-{out.name}-", f".old-{out.name}-"):
                if not p.name.startswith(prefix):
                    continue
                pid = p.name[len(prefix) :].split("-")[0]
                if pid.isdigit() and not pid_alive(int(pid)):
                    if p.is_dir():
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        with contextlib.suppress(FileNotFoundError):
                            p.unlink()
                    removed.append(p)
    return removed
