"""Every path a written repository names resolves inside the serving container, in every deployment form.

For each repository kind (torch runtime in process and over BLS, trtllm-engine on stand-in engine directories,
trtllm-llmapi) the repository is written as each form's build writes it, then ``container_paths.path_problems`` resolves
every path its ``config.pbtxt`` parameters and ``model.yaml`` name under the mounts the form gives the server:
``trtspec serve --docker`` (the repository written on this machine, the ``-v`` flags of the command), compose
(``docker/compose.yaml``: the image's build writes /workspace/build, /engines, /models; the models come in /spec) and
Kubernetes (``docker/k8s/``: the build Job writes the artifacts claim, the Deployment's pod mounts it). For compose and
Kubernetes the build container's file system is a directory here (``root``), so what the build wrote is checked too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.engine_helpers import copy_tokenizer
from tests.serving_helpers import torch_spec_dict
from tests.upstream import facts
from trtspec.spec import spec_from_dict

DOCKER = Path(__file__).resolve().parents[1] / "docker"
IMAGE = "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3"
KINDS = ("torch-in-process", "torch-bls", "trtllm-engine", "trtllm-llmapi")
FORMS = ("docker", "compose", "kubernetes")


def _spec_dict(kind: str, target: Path, draft: Path) -> dict:
    if kind.startswith("torch"):
        return torch_spec_dict(target, draft, triton={"orchestration": kind.removeprefix("torch-").replace("-", "_")})
    data = torch_spec_dict(target, draft, runtime=kind)
    for role in ("target", "draft"):
        data[role].update(quantization="none", dtype="float16")
    data["engine"]["trtllm_version"] = "1.0.0"
    if kind == "trtllm-engine":  # engines are built from the quantize stage's checkpoints
        data["target"] = data["draft"] = {**data["target"], "quantization": "fp8", "dtype": "bfloat16"}
    return data


def _stand_in_engines(spec) -> None:
    """What the quantize and compile stages leave for an engine repository: the target's checkpoint with its
    tokenizer (the quantize stage saves it there) and, per role, an engine directory (config.json with the release
    that built it, an empty rank0.engine: the STAND-IN the repository tests use)."""
    from trtspec.build.layout import checkpoint_dir, engine_dir

    copy_tokenizer(Path(spec.target.model), checkpoint_dir(spec, "target"))
    for role in ("target", "draft"):
        engine_dir(spec, role).mkdir(parents=True)
        (engine_dir(spec, role) / "config.json").write_text(
            json.dumps({"version": spec.engine.trtllm_version, "build_config": {}, "pretrained_config": {}})
        )
        (engine_dir(spec, role) / "rank0.engine").write_bytes(b"")


def _built(tmp_path: Path, tiny_pair, kind: str, form: str):
    """(repository, the form, root): the repository as the form's build writes it. compose and Kubernetes build in
    the image (the Dockerfile's output directories) with the models where those forms put them; ``root`` stands for
    that container's /."""
    from trtspec.pipeline import write_repo
    from trtspec.serving.container_paths import compose_form, docker_form, kubernetes_form

    if form == "docker":
        root, models = None, tmp_path / "models"
        outputs = {"build_dir": tmp_path / "build", "engines_dir": tmp_path / "engines", "repo_dir": tmp_path / "repo"}
    else:
        root = tmp_path / "container"
        models = root / ("spec/models" if form == "compose" else "source-models")  # /spec is TRTSPEC_PROJECT
        env = _dockerfile_env()
        outputs = {
            key: root / env[f"TRTSPEC_SPEC__OUTPUT__{key.upper()}"].lstrip("/")
            for key in ("build_dir", "engines_dir", "repo_dir")
        }
    pair = []
    for src, role in zip(tiny_pair, ("target", "draft"), strict=True):
        shutil.copytree(src, models / role)
        pair.append(models / role)
    data = _spec_dict(kind, *pair)
    data["output"] = {k: str(v) for k, v in outputs.items()}
    spec = spec_from_dict(data, source="test", base_dir=tmp_path, environ={})
    if kind == "trtllm-engine":
        _stand_in_engines(spec)
    repo = Path(write_repo(spec)["path"])
    if form == "docker":
        return repo, docker_form(repo, IMAGE), root
    if form == "compose":
        return repo, compose_form(DOCKER / "compose.yaml"), root
    return repo, kubernetes_form(DOCKER / "k8s" / "deployment.yaml", DOCKER / "k8s" / "build-job.yaml"), root


def _dockerfile_env() -> dict[str, str]:
    import re

    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    env = {}
    for line in text.splitlines():
        if line.strip().startswith("ENV "):
            env.update(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    return env


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_path_a_repository_names_resolves_in_the_serving_container(tmp_path, tiny_pair, kind, form):
    from trtspec.serving.container_paths import named_paths, path_problems

    repo, deployment, root = _built(tmp_path, tiny_pair, kind, form)
    named = named_paths(repo)
    # The check sees the paths upstream's models open (tests/upstream/container_paths.json).
    read = {(p["model_kind"], p["key"]) for p in facts.load("container_paths")["paths"]}
    keys = {n.where.split()[-1] for n in named}
    if kind == "trtllm-engine":
        assert ("tensorrt_llm", "gpt_model_path") in read and "gpt_model_path" in keys
    if kind == "trtllm-llmapi":
        assert ("llmapi", "model") in read and "model" in keys
    else:
        assert ("preprocessing", "tokenizer_dir") in read and "tokenizer_dir" in keys
    assert path_problems(repo, deployment, root=root) == []


def test_the_tokenizer_travels_inside_the_repository(tmp_path, tiny_pair):
    """pre/postprocessing read their own copy (relative to the version directory), not the build's checkpoint: an
    engine repository needs only itself and the engines, wherever the checkpoints went."""
    from trtspec.triton_repo.text import load_tokenizer

    repo, _, _ = _built(tmp_path, tiny_pair, "trtllm-engine", "docker")
    for model in ("preprocessing", "postprocessing"):
        config = (repo / model / "config.pbtxt").read_text()
        assert 'string_value: "tokenizer"' in config and str(tmp_path) not in config
        copy = repo / model / "1" / "tokenizer"
        assert (copy / "tokenizer.json").is_file()
        assert load_tokenizer(copy).encode("hello world") == load_tokenizer(tiny_pair[0]).encode("hello world")
    manifest = json.loads((repo / "manifest.json").read_text())
    assert not [h for h, _ in manifest["container_mounts"] if "build" in Path(h).parts]  # no checkpoint to mount


def test_a_path_no_mount_holds_or_the_build_never_wrote_is_one_line(tmp_path, tiny_pair):
    """The check itself: one line naming the model, the key, the path and the mounts."""
    from trtspec.serving.container_paths import kubernetes_form, path_problems

    repo, form, root = _built(tmp_path, tiny_pair, "trtllm-engine", "kubernetes")
    config = repo / "preprocessing" / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "tokenizer"', 'string_value: "/opt/tok"'))
    (problem,) = path_problems(repo, form, root=root)
    assert problem.startswith("kubernetes: preprocessing (config.pbtxt parameter tokenizer_dir) names /opt/tok")
    assert "no mount of the serving container holds it (mounts: " in problem and "/models" in problem

    config.write_text(config.read_text().replace("/opt/tok", "/engines/tokenizer"))
    (problem,) = path_problems(repo, form, root=root)
    assert problem.endswith("the build wrote nothing at /engines/tokenizer")

    # A pod that mounts only the repository: the engines it names are on no mount.
    pod = yaml.safe_load((DOCKER / "k8s" / "deployment.yaml").read_text())
    (container,) = pod["spec"]["template"]["spec"]["containers"]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["mountPath"] == "/models"]
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(pod))
    narrow = kubernetes_form(tmp_path / "deployment.yaml", DOCKER / "k8s" / "build-job.yaml")
    problems = path_problems(repo, narrow, root=root)
    assert any("tensorrt_llm (config.pbtxt parameter gpt_model_path) names /engines/target" in p for p in problems)


def test_serve_docker_refuses_a_repository_whose_files_are_gone_in_one_line(tmp_path, tiny_pair):
    import os
    import subprocess
    import sys

    repo, _, _ = _built(tmp_path, tiny_pair, "torch-in-process", "docker")
    argv = [sys.executable, "-m", "trtspec", "serve", str(repo), "--docker", IMAGE, "--dry-run"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    ok = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    shutil.rmtree(tmp_path / "models" / "draft")  # the draft the in-process model loads
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "hint:" in r.stderr, r.stderr
    assert "tensorrt_llm (config.pbtxt parameter draft_model_dir)" in r.stderr and "does not exist" in r.stderr
    assert "docker run" not in r.stdout  # no command shown for a repository that cannot load
