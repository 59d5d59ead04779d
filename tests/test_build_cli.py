"""`trtspec build` through the real CLI, with every real stage body; trtllm-build is the STAND-IN from tests/standin."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.engine_helpers import engine_spec


def _trtspec(*args, cwd, env):
    return subprocess.run(
        [sys.executable, "-m", "trtspec", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=900
    )


@pytest.mark.slow
def test_build_twice_through_the_cli_with_the_standin(tmp_path, tiny_pair, standin_bin):
    spec = engine_spec(tmp_path, tiny_pair)
    path = tmp_path / "trtspec.yaml"
    path.write_text(yaml.safe_dump(spec.to_yaml_dict()))
    env = {**os.environ, "PATH": f"{standin_bin}{os.pathsep}{os.environ['PATH']}", "TRTLLM_STANDIN_VERSION": "1.0.0"}
    first = _trtspec("build", str(path), "--json", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    statuses = {s["name"]: s["status"] for s in json.loads(first.stdout)["stages"]}
    assert statuses == {
        "check": "passed",
        "quantize:target": "built",
        "quantize:draft": "built",
        "quality": "built",
        "compile:target": "built",
        "compile:draft": "built",
        "repo": "built",
    }
    quality = json.loads((spec.build_dir / "quality.json").read_text())
    assert set(quality["models"]) == {"target", "draft"} and quality["models"]["target"]["format"]
    assert 0.0 <= quality["draft_target_top1_agreement"]["after"] <= 1.0
    second = _trtspec("build", str(path), "--json", cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert {s["status"] for s in json.loads(second.stdout)["stages"] if s["name"] != "check"} == {"skipped"}
    text = (spec.repo_dir / "tensorrt_llm" / "config.pbtxt").read_text()
    assert "${" not in text and 'backend: "tensorrtllm"' in text


@pytest.mark.slow
def test_build_without_spec_builds_the_embedded_example_with_the_torch_runtime(tmp_path, example_paths):
    r = _trtspec("build", "--json", cwd=tmp_path, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    statuses = {s["name"]: s["status"] for s in json.loads(r.stdout)["stages"]}
    assert statuses["repo"] == "built" and statuses["compile:target"] == "not needed"
    assert (tmp_path / "triton_repo").is_dir()
