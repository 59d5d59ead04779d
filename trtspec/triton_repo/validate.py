"""Validate a written repository: every config.pbtxt parses through Triton's schema, and the ensemble is wired
consistently (every mapped tensor exists with the same type on both sides, every output is produced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.errors import TrtspecError
from trtspec.triton_repo.pbtxt import dtype_name, parse

_HINT = "rewrite it with `trtspec repo`"


def load_configs(repo: Path) -> dict[str, Any]:
    """Parse every ``<model>/config.pbtxt`` of a repository."""
    repo = Path(repo)
    configs = {}
    for cfg_path in sorted(repo.glob("*/config.pbtxt")):
        config = parse(cfg_path.read_text(encoding="utf-8"), str(cfg_path))
        if config.name != cfg_path.parent.name:
            raise TrtspecError(f"{cfg_path}: model name {config.name!r} differs from its directory", hint=_HINT)
        configs[config.name] = config
    if not configs:
        raise TrtspecError(f"{repo}: no models (no */config.pbtxt)", hint=_HINT)
    return configs


def _check_model_dir(repo: Path, config: Any) -> None:
    d = repo / config.name
    if not (d / "1").is_dir():
        raise TrtspecError(f"{d}: missing version directory 1/", hint=_HINT)
    if config.backend == "python" and not (d / "1" / "model.py").is_file():
        raise TrtspecError(f"{d}/1/model.py: missing", hint=_HINT)


def _check_ensemble(ens: Any, configs: dict[str, Any]) -> None:
    where = f"ensemble {ens.name!r}"
    available = {i.name: dtype_name(i.data_type) for i in ens.input}
    for step in ens.ensemble_scheduling.step:
        model = configs.get(step.model_name)
        if model is None:
            raise TrtspecError(f"{where}: step model {step.model_name!r} is not in the repository", hint=_HINT)
        inputs = {i.name: i for i in model.input}
        outputs = {o.name: o for o in model.output}
        for key, value in step.input_map.items():
            if key not in inputs:
                raise TrtspecError(f"{where}: {step.model_name} has no input {key!r}", hint=_HINT)
            if value not in available:
                raise TrtspecError(
                    f"{where}: {step.model_name}.{key} reads {value!r}, which nothing produces", hint=_HINT
                )
            if available[value] != dtype_name(inputs[key].data_type):
                raise TrtspecError(
                    f"{where}: {step.model_name}.{key} is {dtype_name(inputs[key].data_type)} but "
                    f"{value!r} is {available[value]}",
                    hint=_HINT,
                )
        missing = [n for n, i in inputs.items() if not i.optional and n not in step.input_map]
        if missing:
            raise TrtspecError(f"{where}: required input {missing[0]!r} of {step.model_name} is not mapped", hint=_HINT)
        for key, value in step.output_map.items():
            if key not in outputs:
                raise TrtspecError(f"{where}: {step.model_name} has no output {key!r}", hint=_HINT)
            available[value] = dtype_name(outputs[key].data_type)
    for out in ens.output:
        if out.name not in available:
            raise TrtspecError(f"{where}: output {out.name!r} is produced by no step", hint=_HINT)
        if available[out.name] != dtype_name(out.data_type):
            raise TrtspecError(
                f"{where}: output {out.name!r} is declared {dtype_name(out.data_type)} but produced "
                f"as {available[out.name]}",
                hint=_HINT,
            )


def validate_repo(repo: Path) -> dict[str, Any]:
    """Parse and cross-check a repository; return its configs by model name."""
    repo = Path(repo)
    configs = load_configs(repo)
    for config in configs.values():
        _check_model_dir(repo, config)
        if config.platform == "ensemble":
            _check_ensemble(config, configs)
    return configs
