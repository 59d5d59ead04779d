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
