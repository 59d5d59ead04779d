"""``trtspec repo``: write the Triton model repository for a spec, atomically, with a manifest.

The pipeline's repo stage (:mod:`trtspec.pipeline`, for `trtspec build` and `trtspec repo`) calls ``repo_inputs``
(what to hash) and ``write_repo_into`` (write into a temporary directory it renames); ``repo_plan`` is its entry in
`trtspec plan`. The writer never imports the pipeline: the pipeline calls the writer.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from trtspec.build.artifacts import MANIFEST
from trtspec.build.layout import ROLES, served_ngram_pool, serving_model_dir
from trtspec.build.stages import PlanEntry
from trtspec.errors import SpecError
from trtspec.spec import BuildSpec
from trtspec.triton_repo.definitions import (
    ENSEMBLE,
    MODELS_DIR,
    TOKENIZER_DIR,
    ModelDefinition,
    repository_models,
    tokenizer_source,
)
from trtspec.triton_repo.pbtxt import serialize
from trtspec.triton_repo.validate import validate_repo

# What AutoTokenizer.from_pretrained (and trtspec's FastTokenizer) read from a model directory: the tokenizer, its
# configuration and chat template, and a Hugging Face config.json (the model type, where tokenizer_config.json names
# no tokenizer class).
TOKENIZER_PATTERNS = (
    "tokenizer*.json",
    "tokenizer.model",
    "*.tiktoken",
    "spiece.model",
    "vocab.*",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.*",
    "tokenization_*.py",
    "config.json",
)
TOKENIZER_REQUIRED = ("tokenizer.json", "tokenizer.model", "*.tiktoken", "spiece.model", "vocab.*")


def tokenizer_files(source: Path) -> list[Path]:
    """The tokenizer files of a model directory (empty when it holds no tokenizer)."""
    source = Path(source)
    if not source.is_dir() or not any(p.is_file() for pat in TOKENIZER_REQUIRED for p in source.glob(pat)):
        return []
    return sorted({p for pat in TOKENIZER_PATTERNS for p in source.glob(pat) if p.is_file() and _wanted(p)})


def _wanted(path: Path) -> bool:
    """config.json only when it is a Hugging Face model config (a TensorRT-LLM checkpoint's is not one: no
    model_type, which AutoTokenizer would look up in it)."""
    if path.name != "config.json":
        return True
    import json

    try:
        return "model_type" in json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def repo_inputs(spec: BuildSpec) -> tuple[dict[str, Path | None], dict]:
    """What the repository depends on: the model sources shipped with trtspec, and the spec's serving settings.

    Model weights are referenced by path, not copied, so their content does not enter the hash; their paths do, and
    so do the manifests of the directories trtspec built for them (engines, quantized checkpoints): a repository
    is rewritten after what it serves was rebuilt. For engines, the version guard runs here, before any up-to-date
    test: engines built by another TensorRT-LLM release than the serving image's are refused even when nothing else
    changed (the image is an input too).
    """
    from trtspec import __version__

    settings: dict[str, Any] = {
        "trtspec": __version__,
        "name": spec.name,  # the served model's id (the OpenAI frontend's /v1/models)
        "runtime": spec.runtime.value,
        "model_dirs": {r: str(serving_model_dir(spec, r)) for r in ROLES},
        "dtypes": {r: getattr(spec, r).dtype.value for r in ROLES},
        "speculative": spec.speculative.model_dump(mode="json"),
        "engine": spec.engine.model_dump(mode="json"),
        "triton": spec.triton.model_dump(mode="json"),
        "gpu": spec.gpu.model_dump(mode="json"),  # the memory plan sizes the engines' KV caches
        "parallel": {r: getattr(spec, r).tp_size for r in ROLES},
    }
    from trtspec.trtllm.engine_dir import version_guard_settings

    settings.update(version_guard_settings(spec))
    # The pool is copied into (or read by) the repository: a rebuilt pool rewrites it.
    paths: dict[str, Path | None] = {"model_sources": MODELS_DIR, "ngram_pool": served_ngram_pool(spec)}
    for f in tokenizer_files(tokenizer_source(spec)):  # copied into the repository: a changed tokenizer rewrites it
        paths[f"tokenizer/{f.name}"] = f
    for role in ROLES:
        manifest = serving_model_dir(spec, role) / MANIFEST
        paths[f"{role}_manifest"] = manifest if manifest.is_file() else None
    return paths, settings


def _check_sources(spec: BuildSpec, models: list[ModelDefinition]) -> None:
    for m in models:
        for path in m.external_paths + ([m.tokenizer_from] if m.tokenizer_from is not None else []):
            if not Path(path).is_dir():
                raise SpecError(
                    f"{m.name} reads {path}, which does not exist yet",
                    hint="run the earlier stages first (`trtspec build`), or fix the model path",
                )
        if m.tokenizer_from is not None and not tokenizer_files(m.tokenizer_from):
            raise SpecError(
                f"{m.name} copies the tokenizer from {m.tokenizer_from}, which holds none "
                "(no tokenizer.json, tokenizer.model or vocabulary file)",
                hint="save the target's tokenizer into its model directory (tokenizer.save_pretrained(DIR))",
            )


def _write_model(out_dir: Path, m: ModelDefinition) -> None:
    model_dir = out_dir / m.name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(serialize(m.config), encoding="utf-8")  # checked to parse back
    for rel, src in m.files.items():
        dst = model_dir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    if m.tokenizer_from is not None:
        (model_dir / "1" / TOKENIZER_DIR).mkdir()
        for f in tokenizer_files(m.tokenizer_from):
            shutil.copyfile(f, model_dir / "1" / TOKENIZER_DIR / f.name)
    for rel, content in m.texts.items():
        dst = model_dir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(content, encoding="utf-8")


def write_repo_into(spec: BuildSpec, out_dir: Path) -> dict:
    """Write every model into ``out_dir`` (an empty directory) and validate; return extra manifest fields."""
    models = repository_models(spec)
    _check_sources(spec, models)
    for m in models:
        _write_model(Path(out_dir), m)
    validate_repo(Path(out_dir))
    external = sorted({str(p) for m in models for p in m.external_paths})
    # Host directory -> its path inside a serving container (the same path unless a definition says otherwise).
    mounts = {str(p): m.container_paths.get(p, str(p)) for m in models for p in m.external_paths}
    server_env = {k: v for m in models for k, v in m.server_env.items()}
    entry_model = ENSEMBLE if ENSEMBLE in {m.name for m in models} else models[0].name
    return {
        "models": [m.name for m in models],
        "external_paths": external,
        "entry_model": entry_model,
        "container_mounts": sorted(mounts.items()),
        "server_env": server_env,
    }


def repo_plan(spec: BuildSpec) -> PlanEntry:
    """The repo stage's entry in `trtspec plan`: the models this runtime's repository holds (``repository_models``,
    on the model directories as the plan names them: a hub id's weights are never fetched to plan)."""
    planned = spec.model_copy(
        update={
            str(role): getattr(spec, role).model_copy(update={"model": str(spec.model_path(role, weights=False))})
            for role in ROLES
        }
    )
    names = [m.name for m in repository_models(planned)]
    return PlanEntry(
        f"Triton model repository ({spec.runtime.value}): {', '.join(names)}",
        [str(serving_model_dir(spec, r, weights=False)) for r in ROLES],
    )
