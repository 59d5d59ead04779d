"""`trtspec compile`: the TensorRT-LLM engines (runtime trtllm-engine), or the docker command that builds them."""

from __future__ import annotations

import typer

from trtspec.cli._common import err_console, resolve_spec
from trtspec.cli._options import ForceOpt, JsonOpt, OnlyOpt, SpecArg
from trtspec.cli._stages import run_stages


def compile(spec_path: SpecArg = None, only: OnlyOpt = None, force: ForceOpt = False, as_json: JsonOpt = False) -> None:
    """Build the TensorRT-LLM engines (runtime trtllm-engine) with trtllm-build, or print the docker command."""
    import shlex

    from trtspec.build.artifacts import MANIFEST
    from trtspec.build.layout import engine_dir, served_roles
    from trtspec.errors import EngineBuildError, SpecError
    from trtspec.spec import Runtime
    from trtspec.trtllm.compile import docker_command, find_trtllm_build

    spec = resolve_spec(spec_path)
    if spec.runtime is not Runtime.TRTLLM_ENGINE:
        raise SpecError(
            f"runtime {spec.runtime.value} has no engines to compile",
            hint="set runtime: trtllm-engine, or go on with `trtspec build`",
        )
    roles = [only.value] if only is not None else list(served_roles(spec))
    try:
        run_stages(spec, [f"compile:{r}" for r in roles], force, as_json)
    except EngineBuildError:
        if find_trtllm_build() is None:
            # What to run elsewhere, for every role still without an engine; the next `trtspec compile` adopts them.
            for role in roles:
                if not (engine_dir(spec, role) / MANIFEST).is_file():
                    err_console.print(
                        f"[dim]{role}:[/] {shlex.join(docker_command(spec, role))}", highlight=False, soft_wrap=True
                    )
        raise


def register(app: typer.Typer) -> None:
    app.command()(compile)
