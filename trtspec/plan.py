"""The build plan: every stage of ``pipeline_stages`` (the list `trtspec build` runs) with its inputs, outputs and the
exact external commands, plus how the result is served, without running anything.

Each stage describes itself (its ``describe``: the quantize, compile and repo entries live with those stages' bodies),
so the plan and the pipeline cannot disagree about which stages there are, what they write and which are not needed.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field

from trtspec.pipeline import pipeline_stages
from trtspec.serving.launch import serve_plan
from trtspec.spec import BuildSpec


@dataclass(frozen=True)
class Stage:
    name: str
    action: str
    inputs: list[str]
    outputs: list[str]
    commands: list[list[str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["command_lines"] = [shlex.join(c) for c in self.commands]
        return d


def build_plan(spec: BuildSpec) -> list[Stage]:
    """All stages of `trtspec build` for this spec, in order, then the serve step."""
    stages = []
    for s in pipeline_stages(spec):
        assert s.describe is not None, s.name
        entry = s.describe()
        outputs = [str(s.output)] if s.output is not None and s.not_needed is None else []
        stages.append(Stage(s.name, entry.action, entry.inputs, outputs, entry.commands))
    serve = serve_plan(spec)
    stages.append(Stage("serve", serve.action, serve.inputs, [], serve.commands))
    return stages
