"""Reading and verifying a TensorRT-LLM engine directory (``config.json`` + ``rank<i>.engine``), and the version guard.

An engine's ``config.json`` is what ``Engine.save`` writes: ``version`` (the TensorRT-LLM release that built it),
``pretrained_config`` (the checkpoint's config, with ``mapping``) and ``build_config`` (``max_batch_size``,
``max_input_len``, ``max_seq_len``, ``max_draft_len``, ``speculative_decoding_mode`` as SpeculativeDecodingMode's int,
``gather_generation_logits``, ``plugin_config`` ...). Engines only load in the TensorRT-LLM release that built them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from trtspec.build.layout import engine_dir, served_roles
from trtspec.errors import EngineBuildError
from trtspec.spec import BuildSpec
from trtspec.trtllm.trtllm_versions import (
    SPECULATIVE_MODE_VALUES,
    image_trtllm_version,
    ngc_image,
    normalize_version,
)

ENGINE_CONFIG = "config.json"


@dataclass(frozen=True)
class EngineInfo:
    """What an engine directory says about itself."""

    path: str
    trtllm_version: str
    architecture: str | None
    dtype: str | None
    world_size: int
    tp_size: int
    pp_size: int
    max_batch_size: int | None
    max_input_len: int | None
    max_seq_len: int | None
    max_draft_len: int
    speculative_decoding_mode: str
    gather_generation_logits: bool
    rank_files: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def _mode_name(raw: object) -> str:
    if raw is None:
        return "none"
    if isinstance(raw, int):
        for name, value in SPECULATIVE_MODE_VALUES.items():
            if value == raw:
                return name
        return f"unknown({raw})"
    text = str(raw).lower().removeprefix("speculativedecodingmode.")
    return "lookahead_decoding" if text == "lookahead" else text


def read_engine(path: Path) -> EngineInfo:
    """Parse an engine directory; raise EngineBuildError naming what is missing or malformed."""
    path = Path(path)
    cfg_path = path / ENGINE_CONFIG
    if not cfg_path.is_file():
        raise EngineBuildError(
            f"{path}: no engine here ({ENGINE_CONFIG} missing)", hint="build the engines with `trtspec compile`"
        )
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EngineBuildError(f"{cfg_path}: not valid JSON ({exc})", hint="rebuild the engine") from None
    if not isinstance(cfg, dict) or "version" not in cfg or "build_config" not in cfg:
        raise EngineBuildError(
            f"{cfg_path}: not a TensorRT-LLM engine config (no version/build_config)",
            hint="engines from trtllm-build record both; rebuild with `trtspec compile`",
        )
    pretrained = cfg.get("pretrained_config") or {}
    build = cfg.get("build_config") or {}
    mapping = pretrained.get("mapping") or {}
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    world = int(mapping.get("world_size", tp * pp))
    ranks = tuple(f"rank{i}.engine" for i in range(world))
    missing = [r for r in ranks if not (path / r).is_file()]
    if missing:
        raise EngineBuildError(
            f"{path}: {', '.join(missing)} missing for world size {world}",
            hint="the build did not finish; rebuild with `trtspec compile`",
        )
    return EngineInfo(
        path=str(path),
        trtllm_version=str(cfg["version"]),
        architecture=pretrained.get("architecture"),
        dtype=pretrained.get("dtype"),
        world_size=world,
        tp_size=tp,
        pp_size=pp,
        max_batch_size=build.get("max_batch_size"),
        max_input_len=build.get("max_input_len"),
        max_seq_len=build.get("max_seq_len"),
        max_draft_len=int(build.get("max_draft_len") or 0),
        speculative_decoding_mode=_mode_name(build.get("speculative_decoding_mode")),
        gather_generation_logits=bool(build.get("gather_generation_logits", False)),
        rank_files=ranks,
    )


def verify_engine(path: Path, spec: BuildSpec, role: str) -> EngineInfo:
    """Read an engine and check it is the one the spec asks for (version, draft length, limits, parallelism)."""
    info = read_engine(path)
    model = getattr(spec, role)
    problems: list[str] = []
    want_version = normalize_version(spec.engine.trtllm_version)
    if normalize_version(info.trtllm_version) != want_version:
        problems.append(f"built by TensorRT-LLM {info.trtllm_version}, spec wants {want_version}")
    if role == "target":
        if info.max_draft_len != spec.speculative.max_draft_len:
            problems.append(f"max_draft_len {info.max_draft_len}, spec wants {spec.speculative.max_draft_len}")
        if info.speculative_decoding_mode != "draft_tokens_external":
            problems.append(
                f"speculative_decoding_mode {info.speculative_decoding_mode}, draft-target needs draft_tokens_external"
            )
    if spec.speculative.use_draft_logits and not info.gather_generation_logits:
        problems.append("built without gather_generation_logits, which use_draft_logits needs on both engines")
    for name in ("max_batch_size", "max_input_len", "max_seq_len"):
        got, want = getattr(info, name), getattr(spec.engine, name)
        if got is not None and got != want:
            problems.append(f"{name} {got}, spec wants {want}")
    if info.tp_size != model.tp_size:
        problems.append(f"tp_size {info.tp_size}, spec wants {model.tp_size}")
    if problems:
        raise EngineBuildError(
            f"{path}: engine does not match the spec: {'; '.join(problems)}", hint="rebuild it with `trtspec compile`"
        )
    return info


# -- version guard ----------------------------------------------------------------------------------------------
def serving_image(spec: BuildSpec, image: str | None = None) -> str:
    """The image that serves the repository: an explicit one, the spec's, or the table's for trtllm_version."""
    return image or spec.triton.image or ngc_image(spec.engine.trtllm_version)


def serving_trtllm_version(spec: BuildSpec, image: str | None = None) -> str:
    """The TensorRT-LLM release the serving image ships.

    NGC ``tritonserver:<yy.mm>-trtllm-python-py3`` tags are looked up in the table; any other image (e.g. the one
    docker/Dockerfile builds FROM the table's image) is taken to ship ``engine.trtllm_version``.
    """
    chosen = serving_image(spec, image)
    shipped = image_trtllm_version(chosen)
    return normalize_version(shipped if shipped is not None else spec.engine.trtllm_version)


def check_engine_versions(
    spec: BuildSpec, image: str | None = None, engine_dirs: dict[str, Path] | None = None
) -> dict[str, str]:
    """Refuse engines built by another TensorRT-LLM release than the serving image's; return role -> version.

    Called by the pipeline before the repo stage, and meant for `trtspec repo` and `trtspec serve --docker IMAGE`.
    """
    want = serving_trtllm_version(spec, image)
    dirs = engine_dirs or {role: engine_dir(spec, role) for role in served_roles(spec)}
    found: dict[str, str] = {}
    for role, path in dirs.items():
        info = read_engine(path)
        got = normalize_version(info.trtllm_version)
        if got != want:
            raise EngineBuildError(
                f"engines/{role} was built by TensorRT-LLM {got}, but {serving_image(spec, image)} serves {want}",
                hint=f"rebuild with engine.trtllm_version: '{want}' (`trtspec compile`), or serve with an image "
                f"that ships {got}",
            )
        found[role] = got
    return found


def version_guard_settings(spec: BuildSpec) -> dict[str, object]:
    """For runtime trtllm-engine: run the version guard and return what the repository depends on because of it
    (the serving image and each engine's release); {} for the other runtimes. Raises EngineBuildError on a mismatch."""
    from trtspec.spec import Runtime

    if spec.runtime is not Runtime.TRTLLM_ENGINE:
        return {}
    return {"serving_image": serving_image(spec), "engine_trtllm_versions": check_engine_versions(spec)}


def check_repo_engines(repo: Path, image: str) -> dict[str, str]:
    """The version guard for `trtspec serve --docker IMAGE`: refuse a repository whose engines were built by another
    TensorRT-LLM release than ``image`` ships; return engine path -> release ({} for repositories without engines).

    The engines are found through the repository's manifest (their host paths); an image outside the NGC table is
    accepted only when it is the image the repository was written for (``triton.image`` in the spec)."""
    from trtspec.build.artifacts import read_manifest

    manifest = read_manifest(Path(repo)) or {}
    settings = manifest.get("settings") or {}
    if settings.get("runtime") != "trtllm-engine":
        return {}
    engines = [
        Path(host) for host, inside in manifest.get("container_mounts") or [] if str(inside).startswith("/engines/")
    ]
    shipped = image_trtllm_version(image)
    if shipped is None:
        if image == settings.get("serving_image"):
            return {str(p): normalize_version(read_engine(p).trtllm_version) for p in engines}
        raise EngineBuildError(
            f"{image}: not an NGC tritonserver trtllm image trtspec knows, and not the image this repository was "
            f"written for ({settings.get('serving_image')}); cannot check the engines' TensorRT-LLM release",
            hint="serve with a tag from `trtspec plan`, or set triton.image in the spec and rerun `trtspec repo`",
        )
    want = normalize_version(shipped)
    found = {}
    for path in engines:
        got = normalize_version(read_engine(path).trtllm_version)
        if got != want:
            raise EngineBuildError(
                f"{path} was built by TensorRT-LLM {got}, but {image} ships {want}",
                hint=f"serve with an image that ships {got}, or rebuild with "
                f"engine.trtllm_version: '{want}' (`trtspec build`)",
            )
        found[str(path)] = got
    return found
