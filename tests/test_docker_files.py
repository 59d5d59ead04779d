"""docker/: the Dockerfile, compose and Kubernetes files parse, name the version table's image and the same ports."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from trtspec.spec import EngineSpec
from trtspec.trtllm.container import PORTS
from trtspec.trtllm.trtllm_versions import ngc_image

DOCKER = Path(__file__).resolve().parents[1] / "docker"
BASE = ngc_image(EngineSpec().trtllm_version)  # the image for the default TensorRT-LLM release
TAG = BASE.rsplit(":", 1)[1]
OUR_IMAGE = f"trtspec:{TAG}"
WANT_PORTS = set(PORTS.values())


def _dockerfile() -> dict[str, list[str]]:
    """Instructions -> arguments, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (DOCKER / "Dockerfile").read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        out.setdefault(op.upper(), []).append(rest.strip())
    return out


def test_dockerfile_builds_on_the_version_tables_image_and_exposes_triton_ports():
    df = _dockerfile()
    args = dict(a.split("=", 1) for a in df["ARG"] if "=" in a)
    assert args["BASE_IMAGE"] == BASE
    assert df["FROM"] == ["${BASE_IMAGE}"]
    assert {int(p) for e in df["EXPOSE"] for p in e.split()} == WANT_PORTS
    assert "/v2/health/ready" in df["HEALTHCHECK"][0] and "/health" in df["HEALTHCHECK"][0]
    assert f"TRTSPEC_OPENAI_PORT={PORTS['openai']}" in " ".join(df["ENV"])
    assert any("[frontend]" in r for r in df["RUN"])  # the frontend's dependencies are installed
    assert any("pip install" in r and "." in r for r in df["RUN"])
    assert "TRTSPEC_SPEC__OUTPUT__ENGINES_DIR=/engines" in " ".join(df["ENV"])
    assert (DOCKER / "entrypoint.sh").stat().st_mode & 0o111


def test_compose_reserves_gpus_publishes_ports_and_checks_readiness():
    svc = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["triton"]
    assert svc["build"]["args"]["BASE_IMAGE"] == BASE and svc["image"] == OUR_IMAGE
    # HOST:PORT:PORT, the host loopback unless TRTSPEC_PUBLISH_HOST says otherwise (docker publishes a bare
    # PORT:PORT on every interface)
    hosts = {p.rsplit(":", 2)[0] for p in svc["ports"]}
    assert hosts == {"${TRTSPEC_PUBLISH_HOST:-127.0.0.1}"}, svc["ports"]
    published = {int(p.rsplit(":", 2)[1]) for p in svc["ports"]}
    assert published == WANT_PORTS and {int(p.rsplit(":", 2)[2]) for p in svc["ports"]} == WANT_PORTS
    assert "TRTSPEC_API_KEY" in svc["environment"]
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert any(v.split(":")[1] == "/engines" for v in svc["volumes"])
    assert any("/v2/health/ready" in part for part in svc["healthcheck"]["test"])


def _k8s() -> dict[str, dict]:
    docs = {}
    for path in sorted((DOCKER / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return docs


def test_kubernetes_manifests_serve_on_gpus_with_probes_pdb_and_queue_autoscaling():
    docs = _k8s()
    dep = docs["Deployment/trtspec-triton"]
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == OUR_IMAGE
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert {p["containerPort"] for p in container["ports"]} == WANT_PORTS
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["openai"] == PORTS["openai"]
    assert {e["name"]: e["value"] for e in container["env"]}["TRTSPEC_OPENAI_PORT"] == str(PORTS["openai"])
    # Generation, not only the port: Triton's health endpoints stay 200 after a model stub died.
    for probe in ("readinessProbe", "livenessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[:2] == ["trtspec", "probe"], probe
        timeout = float(command[command.index("--timeout") + 1])
        assert timeout < container[probe]["timeoutSeconds"], probe  # the probe reports before the kubelet kills it
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    # SIGTERM drains: the grace period covers preStop, the drain and the server's stop.
    drain_s = float({e["name"]: e["value"] for e in container["env"]}["TRTSPEC_DRAIN_TIMEOUT"])
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep" and pod["terminationGracePeriodSeconds"] >= float(pre_stop[1]) + drain_s + 30
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"] == labels

    svc = docs["Service/trtspec-triton"]
    assert {p["port"] for p in svc["spec"]["ports"]} == WANT_PORTS and svc["spec"]["selector"] == labels
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]}["openai"] == "openai"

    pdb = docs["PodDisruptionBudget/trtspec-triton"]
    assert pdb["spec"]["selector"]["matchLabels"] == labels and pdb["spec"]["minAvailable"] >= 1

    hpa = docs["HorizontalPodAutoscaler/trtspec-triton"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "trtspec-triton"}
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"].startswith("nv_inference_")
    assert "queue" in metric["pods"]["metric"]["name"] or "pending" in metric["pods"]["metric"]["name"]

    job = docs["Job/trtspec-build"]
    (builder,) = job["spec"]["template"]["spec"]["containers"]
    assert builder["image"] == OUR_IMAGE and builder["args"] == ["build"]
    spec_yaml = yaml.safe_load(docs["ConfigMap/trtspec-spec"]["data"]["trtspec.yaml"])
    assert spec_yaml["engine"]["trtllm_version"] == EngineSpec().trtllm_version


def test_kubernetes_spec_is_a_valid_buildspec():
    from trtspec.spec import spec_from_dict

    data = yaml.safe_load(_k8s()["ConfigMap/trtspec-spec"]["data"]["trtspec.yaml"])
    spec = spec_from_dict(data, source="k8s configmap", environ={})
    assert ngc_image(spec.engine.trtllm_version) == BASE


def test_entrypoint_links_artifacts_to_the_container_paths_the_configs_name(tmp_path):
    """runtime trtllm-llmapi's model.yaml reads /checkpoints/<role>: the entrypoint links the checkpoints there."""
    import json
    import subprocess

    built, repo = tmp_path / "build" / "target" / "checkpoint", tmp_path / "models"
    built.mkdir(parents=True)
    repo.mkdir()
    inside = tmp_path / "checkpoints" / "target"
    (repo / "manifest.json").write_text(
        json.dumps({"container_mounts": [[str(built), str(inside)], [str(repo), str(repo)]]})
    )
    import os
    import sys

    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", "TRTSPEC_SPEC__OUTPUT__REPO_DIR": str(repo)}
    r = subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), "link"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert inside.is_symlink() and inside.resolve() == built.resolve()


def _fake_bin(tmp_path, triton_exit: str) -> dict[str, str]:
    """PATH with a fake tritonserver and a python3 whose ``-m trtspec.serving.openai`` is a fake frontend; both write
    their pid and arguments, then sleep (or exit, as told)."""
    import os
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tritonserver").write_text(f'#!/bin/bash\necho $$ "$@" > {tmp_path}/triton\n{triton_exit}\n')
    (bin_dir / "python3").write_text(
        '#!/bin/bash\nif [ "$1 $2" = "-m trtspec.serving.openai" ]; then\n'
        f'  echo $$ "$@" > {tmp_path}/front; exec sleep 300\nfi\nexec {sys.executable} "$@"\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "TRTSPEC_SPEC__OUTPUT__REPO_DIR": str(tmp_path / "models"),
        "HOME": os.environ.get("HOME", "/root"),
    }


def _wait_for(path, timeout_s: float = 20.0) -> list[str]:
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return path.read_text().split()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_entrypoint_serves_triton_and_the_openai_frontend_and_sigterm_stops_both(tmp_path):
    import signal
    import subprocess

    (tmp_path / "models").mkdir()
    env = _fake_bin(tmp_path, "exec sleep 300")
    proc = subprocess.Popen(["bash", str(DOCKER / "entrypoint.sh"), "serve-only", "--log-verbose=1"], env=env)
    try:
        triton = _wait_for(tmp_path / "triton")
        front = _wait_for(tmp_path / "front")
        assert "--grpc-port=8001" in triton and "--log-verbose=1" in triton
        assert front[front.index("--triton") + 1] == "127.0.0.1:8001"
        assert front[front.index("--port") + 1] == str(PORTS["openai"])
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    finally:
        proc.kill()
    import time

    time.sleep(0.5)
    assert not _alive(int(triton[0])) and not _alive(int(front[0]))


def test_entrypoint_stops_the_frontend_when_triton_exits(tmp_path):
    import subprocess

    (tmp_path / "models").mkdir()
    env = _fake_bin(tmp_path, "sleep 1; exit 3")
    r = subprocess.run(["bash", str(DOCKER / "entrypoint.sh"), "serve-only"], env=env, timeout=30)
    assert r.returncode == 3  # Triton's exit status
    import time

    time.sleep(0.5)
    assert not _alive(int(_wait_for(tmp_path / "front")[0]))
    (tmp_path / "front").unlink()
    r = subprocess.run(
        ["bash", str(DOCKER / "entrypoint.sh"), "serve-only"], env={**env, "TRTSPEC_OPENAI_PORT": "0"}, timeout=30
    )
    assert r.returncode == 3 and not (tmp_path / "front").exists()  # Triton alone, exec'd


def test_the_image_keeps_tensorrt_llms_packages_and_installs_what_compile_and_repo_need():
    """The NGC image's torch, transformers and ModelOpt are TensorRT-LLM's (trtllm-build runs on them): the image
    installs trtspec with the frontend extra only, which brings what `compile` (trtllm-build, in the image) and `repo`
    (tritonclient's config protobuf) need; trtspec's own pins for torch/quant would replace TensorRT-LLM's."""
    import tomllib

    extras = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    runs = " ".join(_dockerfile()["RUN"])
    installs = re.findall(r"pip install [^&]*", runs)
    assert installs and all("[frontend]" in i for i in installs)
    for banned in ("torch", "transformers", "modelopt", "[quant]", "[all]", "[torch"):
        assert not any(banned in i for i in installs), banned
    assert any(r.startswith("tritonclient[grpc]") for r in extras["frontend"]) and extras["repo"] == [
        "tritonclient[grpc]>=2.50"
    ]


def _fake_distributions(root: Path, versions: dict[str, str]) -> Path:
    """A directory whose *.dist-info say these versions are installed (importlib.metadata reads the first found)."""
    root.mkdir()
    for name, version in versions.items():
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_quantize_on_the_ngc_images_packages_is_refused_in_one_line(tmp_path, tiny_pair):
    """In the image (TensorRT-LLM's transformers 4.57, ModelOpt 0.37, torch 2.9: tests/upstream/
    trtllm_requirements.json) `trtspec quantize` and `trtspec build` stop before quantizing, one line with a hint,
    exit 1, nothing written; checkpoints quantized where trtspec's pins are met are kept there."""
    import os
    import subprocess
    import sys

    from tests.serving_helpers import torch_spec_dict
    from tests.upstream import facts

    image = dict(facts.load("trtllm_requirements")["installed_example"])
    image.pop("about")
    fake = _fake_distributions(tmp_path / "image-site", image)
    data = torch_spec_dict(*tiny_pair)
    data["target"]["quantization"] = data["draft"]["quantization"] = "fp8"
    (tmp_path / "trtspec.yaml").write_text(yaml.safe_dump(data))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), str(fake)])}
    for command in (["quantize", "trtspec.yaml"], ["build", "trtspec.yaml"]):
        r = subprocess.run(
            [sys.executable, "-m", "trtspec", *command], capture_output=True, text=True, cwd=tmp_path, env=env
        )
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and "hint:" in r.stderr, r.stderr
        assert "quantize needs" in r.stderr and "transformers<5.30,>=5.20 (installed: 4.57.1)" in r.stderr
        assert "nvidia-modelopt==0.47.0 (installed: 0.37.0)" in r.stderr and "torch==2.13.0" in r.stderr
        assert "pip install 'trtspec[torch,quant]'" in r.stderr  # the hint prints the extra (not eaten as markup)
        assert not (tmp_path / "build" / "target").exists(), command

    # Quantized where trtspec's pins are installed (this environment), the same spec's checkpoints are kept in the
    # image: quantize is up to date there, and nothing is quantized again.
    here = {**os.environ, "PYTHONPATH": os.getcwd()}
    r = subprocess.run([sys.executable, "-m", "trtspec", "quantize", "trtspec.yaml"], cwd=tmp_path, env=here)
    assert r.returncode == 0
    manifests = {p: p.read_text() for p in (tmp_path / "build").rglob("manifest.json")}
    r = subprocess.run(
        [sys.executable, "-m", "trtspec", "quantize", "trtspec.yaml", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert {p: p.read_text() for p in (tmp_path / "build").rglob("manifest.json")} == manifests
    assert "skipped" in r.stdout, r.stdout


def test_stage_packages_are_held_to_trtspecs_own_pins_local_builds_included():
    """The pins come from trtspec's installed metadata (pyproject.toml's extras); a local build label (torch's +cpu,
    +cu130, the NGC container's +...nv25.10) is the same release; a missing package is unmet."""
    from trtspec.build.toolchain import trtspec_pins, unmet_packages

    pins = trtspec_pins(['torch==2.13.0; extra == "torch"', 'nvidia-modelopt[torch]==0.47.0; extra == "quant"'])
    assert pins == {"torch": "==2.13.0", "nvidia-modelopt": "==0.47.0"}
    ours = {"torch": "2.13.0+cpu", "transformers": "5.24.0", "safetensors": "0.8.0", "nvidia-modelopt": "0.47.0"}
    assert unmet_packages("quantize", version_of=ours.get) == []
    image = {**ours, "torch": "2.9.0a0+145a3a7bda.nv25.10"}
    del image["safetensors"]
    assert unmet_packages("quantize", version_of=image.get) == [
        ("torch", "==2.13.0", "2.9.0a0+145a3a7bda.nv25.10"),
        ("safetensors", ">=0.4", None),
    ]
    assert unmet_packages("compile") == [] and unmet_packages("repo") == []  # nothing beyond the image's own
