"""Does every file a repository names exist inside the serving container, in each deployment form?

A repository's ``config.pbtxt`` parameters and ``model.yaml`` name files the server opens at load time (the tokenizer,
engines, checkpoints, the n-gram pool, ``model.yaml`` itself). They are read inside a container whose file system is
what its deployment form mounts: ``trtspec serve --docker`` (the ``-v`` flags of ``docker_command``), compose
(``docker/compose.yaml``: the build and the server are one container) and Kubernetes (``docker/k8s/``: the build Job
writes the artifacts volume, the Deployment's pods mount parts of it). ``path_problems`` resolves each named path as
the container would: the entrypoint's links first (``docker/entrypoint.sh`` ``link_mounts``: the manifest's
``container_mounts``), then the mount that holds it, then where the build wrote into that volume. A path no mount
holds, on a volume the build never writes, or that the build did not write, is a problem: one line each.

Upstream reads these paths (tests/upstream/container_paths.json): preprocessing and postprocessing open
``tokenizer_dir`` with ``AutoTokenizer.from_pretrained``, the tensorrtllm backend checks that ``gpt_model_path``
exists, the llmapi model passes ``model.yaml``'s ``model`` to ``LLM(model=...)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from trtspec.trtllm.container import REPO_MOUNT

# Config parameters whose value is a file or directory the model opens (upstream's and trtspec's). Any other string
# parameter that is an absolute path counts too. A relative value is the model's own file, relative to its version
# directory (trtspec.triton_repo.runtime_utils.model_file).
PATH_PARAMETERS = frozenset(
    {
        "tokenizer_dir",  # preprocessing, postprocessing (AutoTokenizer.from_pretrained); the tensorrtllm backend
        "gpt_model_path",  # tensorrtllm backend: the engine directory (model_instance_state.cc checks it exists)
        "encoder_model_path",
        "xgrammar_tokenizer_info_path",
        "lora_prefetch_dir",
        "model_dir",  # trtspec's torch engine models
        "draft_model_dir",
        "ngram_pool",  # trtspec's draft-target models
        "llm_config",  # trtspec's llmapi model: model.yaml
    }
)
# Paths the serving image itself provides (every form runs NVIDIA's tritonserver image, or trtspec's built on it):
# Triton and its backends, e.g. the tensorrtllm backend's executor_worker_path default
# /opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker (tests/upstream/tensorrtllm_backend_parameters.json).
IMAGE_PREFIXES = ("/opt/tritonserver/",)
# model.yaml keys that name paths (dotted: nested): the LLM's checkpoint, tokenizer and the draft's checkpoint.
MODEL_YAML_PATHS = (
    "model",
    "tokenizer",
    "speculative_config.speculative_model",
    "speculative_config.speculative_model_dir",
)


@dataclass(frozen=True)
class NamedPath:
    """One path a repository names: which model, where (parameter or model.yaml key), the value, the container path."""

    model: str
    where: str
    value: str
    path: str  # absolute, in the container (a relative value resolved against the model's version directory)


@dataclass(frozen=True)
class Mount:
    """A container path and the storage behind it: ``volume`` (a host directory ``host:<dir>``, a compose volume, a
    Kubernetes claim) and the directory inside that volume (``subpath``; for a host directory, the directory)."""

    container: str
    volume: str
    subpath: str = ""


@dataclass(frozen=True)
class DeploymentForm:
    """What one deployment form gives the serving container, and where its build wrote into the same volumes.

    ``build_mounts`` None: the repository was written on this machine and host directories are mounted as they are
    (``serve --docker``). ``links``: the container starts through the image's entrypoint, which links the manifest's
    ``container_mounts`` (host path as the build saw it -> the path the configs name) before serving."""

    name: str
    mounts: tuple[Mount, ...]
    build_mounts: tuple[Mount, ...] | None
    links: bool


def _under(path: str, prefix: str) -> str | None:
    """``path`` relative to ``prefix`` ('' for the prefix itself), or None when it is not under it."""
    p, q = PurePosixPath(path), PurePosixPath(prefix)
    if p == q:
        return ""
    try:
        return str(p.relative_to(q))
    except ValueError:
        return None


def _join(*parts: str) -> str:
    return str(PurePosixPath(*[p for p in parts if p])) if any(parts) else ""


def _version_dir(model_dir: Path) -> str:
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    return str(versions[-1]) if versions else "1"  # Triton's default policy serves the latest version


def _yaml_value(data: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def named_paths(repo: Path, repo_mount: str = REPO_MOUNT) -> list[NamedPath]:
    """Every path the repository's ``config.pbtxt`` parameters and ``model.yaml`` files name, in the container where
    the repository is at ``repo_mount``."""
    import yaml

    from trtspec.triton_repo.validate import load_configs

    repo = Path(repo)
    out: list[NamedPath] = []
    for name, config in sorted(load_configs(repo).items()):
        version = _version_dir(repo / name)
        here = f"{repo_mount}/{name}/{version}"
        for key, param in sorted(config.parameters.items()):
            value = param.string_value
            if value and (key in PATH_PARAMETERS or value.startswith("/")):
                path = value if value.startswith("/") else f"{here}/{value}"
                out.append(NamedPath(name, f"config.pbtxt parameter {key}", value, path))
        model_yaml = repo / name / version / "model.yaml"
        if model_yaml.is_file():
            data = yaml.safe_load(model_yaml.read_text(encoding="utf-8")) or {}
            for key in MODEL_YAML_PATHS:
                value = _yaml_value(data, key)
                if isinstance(value, str) and value:
                    # The LLM API opens a relative path against the server's working directory: never the repository.
                    out.append(NamedPath(name, f"model.yaml {key}", value, value))
    return out


def _links(repo: Path, root: Path | None) -> list[tuple[str, str]]:
    """The entrypoint's links, (path the configs name, path the build wrote), longest first."""
    from trtspec.build.artifacts import read_manifest

    out = []
    for host, inside in (read_manifest(Path(repo)) or {}).get("container_mounts") or []:
        host, inside = _in_container(str(host), root), _in_container(str(inside), root)
        if host != inside:
            out.append((inside, host))
    return sorted(out, key=lambda kv: -len(kv[0]))


def _in_container(path: str, root: Path | None) -> str:
    """A path the build wrote, as its container saw it: ``root`` (where that container's file system is on this
    machine, for a build run here as a stand-in) taken off."""
    if root is not None:
        rest = _under(path, str(root))
        if rest is not None:
            return "/" + rest if rest else "/"
    return path


def _holding(mounts: Iterable[Mount], path: str, key: Any = None) -> tuple[Mount, str] | None:
    """The mount that holds ``path`` (the deepest), and the rest of the path below it. ``key``: what of the mount
    to match against (its container path by default)."""
    key = key or (lambda m: m.container)
    found: list[tuple[Mount, str]] = []
    for m in mounts:
        rest = _under(path, key(m))
        if rest is not None:
            found.append((m, rest))
    return max(found, key=lambda mr: len(key(mr[0]))) if found else None


def path_problems(repo: Path, form: DeploymentForm, *, root: Path | None = None) -> list[str]:
    """One line per path the repository names that does not resolve in ``form``'s serving container (empty: all do).

    ``root``: where the build's container file system is on this machine (the build's paths are under it), so that
    what the build wrote can be checked; without it, only that each path lies on a volume the build writes."""
    problems = []
    links = _links(repo, root) if form.links else []
    for named in named_paths(repo):
        what = f"{form.name}: {named.model} ({named.where}) names {named.value}"
        if not named.path.startswith("/"):
            problems.append(f"{what}, a relative path the server resolves against its working directory")
            continue
        if named.path.startswith(IMAGE_PREFIXES):
            continue
        path = _in_container(named.path, root)
        for inside, built in links:
            rest = _under(path, inside)
            if rest is not None:
                path = _join(built, rest)
                break
        held = _holding(form.mounts, path)
        if held is None:
            mounted = ", ".join(sorted(m.container for m in form.mounts))
            problems.append(f"{what}, at {path}: no mount of the serving container holds it (mounts: {mounted})")
            continue
        mount, rest = held
        within = _join(mount.subpath, rest)
        if form.build_mounts is None:  # host directories, mounted as they are
            if not Path(within).exists():
                problems.append(f"{what}: {within}, mounted at {mount.container}, does not exist")
            continue
        same_volume = [b for b in form.build_mounts if b.volume == mount.volume]
        wrote = _holding(same_volume, "/" + within, key=lambda b: "/" + b.subpath)
        if wrote is None:
            problems.append(
                f"{what}, at {path}: its mount {mount.container} ({mount.volume}) is not written by the build"
            )
            continue
        built_at = _join(wrote[0].container, wrote[1])
        if root is not None and not (Path(root) / built_at.lstrip("/")).exists():
            problems.append(f"{what}, at {path}: the build wrote nothing at {built_at}")
    return problems


# -- the three forms -------------------------------------------------------------------------------------------------
def docker_form(repo: Path, image: str) -> DeploymentForm:
    """``trtspec serve REPO --docker IMAGE``: the ``-v`` flags of the command it runs."""
    from trtspec.serving.docker import docker_command, repo_mounts

    mounts, env = repo_mounts(Path(repo))
    argv = docker_command(Path(repo), image, mounts=mounts, env=env)
    out = []
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "-v":
            host, inside = value.split(":")[:2]
            out.append(Mount(inside, "host", host))
    return DeploymentForm("serve --docker", tuple(out), None, links=False)


def _compose_volume(entry: str) -> tuple[str, str]:
    """``SOURCE:TARGET[:MODE]`` -> (SOURCE, TARGET); SOURCE may be ``${VAR:-default}``, whose colon is its own."""
    cut = entry.index("}") + 1 if entry.startswith("${") else 0
    source, target = entry[:cut], entry[cut:]
    head, _, rest = target.partition(":")
    if cut:
        return source, rest.split(":")[0]
    return head, rest.split(":")[0]


def compose_form(compose_file: Path, service: str = "triton") -> DeploymentForm:
    """compose (``docker/compose.yaml``): one container builds, then serves; its volumes are both's mounts."""
    import yaml

    data = yaml.safe_load(Path(compose_file).read_text(encoding="utf-8"))
    svc = data["services"][service]
    named = set(data.get("volumes") or {})
    mounts = []
    for entry in svc.get("volumes") or []:
        source, target = _compose_volume(str(entry))
        mounts.append(Mount(target, f"volume:{source}" if source in named else f"bind:{source}"))
    command = svc.get("command") or ["serve"]
    return DeploymentForm("compose", tuple(mounts), tuple(mounts), links=command[0] in ("serve", "serve-only"))


def _pod_mounts(pod: dict[str, Any], workload: str) -> tuple[Mount, ...]:
    volumes = {}
    for v in pod.get("volumes") or []:
        if "persistentVolumeClaim" in v:
            volumes[v["name"]] = f"pvc:{v['persistentVolumeClaim']['claimName']}"
        elif "configMap" in v:
            volumes[v["name"]] = f"configMap:{v['configMap']['name']}"
        else:  # emptyDir and the like: this pod's own
            volumes[v["name"]] = f"{workload}:{v['name']}"
    (container,) = pod["containers"]
    return tuple(
        Mount(m["mountPath"], volumes[m["name"]], m.get("subPath", "")) for m in container.get("volumeMounts") or []
    )


def kubernetes_form(deployment_file: Path, build_job_file: Path) -> DeploymentForm:
    """Kubernetes (``docker/k8s/``): the Deployment's pod serves what the build Job wrote into the same claims."""
    import yaml

    deployment = yaml.safe_load(Path(deployment_file).read_text(encoding="utf-8"))
    job = yaml.safe_load(Path(build_job_file).read_text(encoding="utf-8"))
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container.get("args") or ["serve"]
    return DeploymentForm(
        "kubernetes",
        _pod_mounts(pod, "deployment"),
        _pod_mounts(job["spec"]["template"]["spec"], "job"),
        links=args[0] in ("serve", "serve-only"),
    )
