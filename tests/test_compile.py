"""The compile stage around trtllm-build: commands run, exit codes, logs, engine verification, the docker fallback.

trtllm-build is the STAND-IN from tests/standin (TensorRT-LLM cannot be installed here); the assertions are on what
trtspec does: the argv it passes, what it refuses, what it records.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.engine_helpers import engine_spec
from trtspec.build.layout import checkpoint_dir, engine_dir
from trtspec.errors import EngineBuildError
from trtspec.pipeline import run_pipeline
from trtspec.trtllm.compile import compile_into, docker_command
from trtspec.trtllm.trtllm_build import trtllm_build_command


def _place_checkpoints(spec, checkpoints):
    for role, src in checkpoints.items():
        shutil.copytree(src, checkpoint_dir(spec, role))


def test_compile_runs_trtllm_build_with_the_planned_commands_and_records_them(
    tmp_path, tiny_pair, trtllm_checkpoints, with_standin, monkeypatch
):
    record = tmp_path / "argv.jsonl"
    monkeypatch.setenv("TRTLLM_STANDIN_RECORD", str(record))
    spec = engine_spec(tmp_path, tiny_pair, speculative={"use_draft_logits": True, "max_draft_len": 6})
    _place_checkpoints(spec, trtllm_checkpoints)
    report = run_pipeline(spec, only=["compile:target", "compile:draft"])
    assert [s.status for s in report.stages] == ["built", "built"]
    argvs = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(argvs) == 2
    for role, argv in zip(("target", "draft"), argvs):
        out = argv[argv.index("--output_dir") + 1]
        assert argv == trtllm_build_command(spec, role, checkpoint_dir(spec, role), out)[1:]
        assert os.path.basename(out).startswith(f".tmp-{role}-")  # built aside, renamed into place when verified
        manifest = json.loads((engine_dir(spec, role) / "manifest.json").read_text())
        assert manifest["engine"]["trtllm_version"] == "1.0.0"
        assert manifest["engine"]["max_draft_len"] == (6 if role == "target" else 0)
        assert manifest["built_by"] == "trtllm-build" and manifest["command"].split()[1:] == argv
        assert (engine_dir(spec, role) / "rank0.engine").is_file()
        assert "Total time of building" in (engine_dir(spec, role) / "trtllm-build.log").read_text()
    target_manifest = json.loads((engine_dir(spec, "target") / "manifest.json").read_text())
    assert target_manifest["engine"]["speculative_decoding_mode"] == "draft_tokens_external"
    draft_manifest = json.loads((engine_dir(spec, "draft") / "manifest.json").read_text())
    assert draft_manifest["engine"]["gather_generation_logits"] is True


def test_failed_build_reports_exit_code_and_stderr_tail_and_keeps_the_log(
    tmp_path, tiny_pair, trtllm_checkpoints, with_standin, monkeypatch
):
    monkeypatch.setenv("TRTLLM_STANDIN_FAIL", "3")
    spec = engine_spec(tmp_path, tiny_pair)
    _place_checkpoints(spec, trtllm_checkpoints)
    with pytest.raises(EngineBuildError) as exc:
        run_pipeline(spec, only=["compile:target"])
    assert "exited with code 3" in exc.value.message and "simulated build failure" in exc.value.message
    log = spec.engines_dir / "logs" / "target.trtllm-build.log"
    assert log.is_file() and str(log) in exc.value.hint
    assert not engine_dir(spec, "target").exists()
    assert not [p for p in spec.engines_dir.iterdir() if p.name.startswith(".tmp-")]


def test_engine_built_by_another_trtllm_version_is_refused(
    tmp_path, tiny_pair, trtllm_checkpoints, with_standin, monkeypatch
):
    monkeypatch.setenv("TRTLLM_STANDIN_VERSION", "1.1.0")  # the tool on PATH is not the spec's release
    spec = engine_spec(tmp_path, tiny_pair)
    _place_checkpoints(spec, trtllm_checkpoints)
    with pytest.raises(EngineBuildError, match="built by TensorRT-LLM 1.1.0, spec wants 1.0.0"):
        run_pipeline(spec, only=["compile:target"])
    assert not engine_dir(spec, "target").exists()


def test_missing_checkpoint_says_to_quantize_first(tmp_path, tiny_pair, with_standin):
    spec = engine_spec(tmp_path, tiny_pair)
    with pytest.raises(EngineBuildError, match="no TensorRT-LLM checkpoint for the target") as exc:
        compile_into(spec, "target", tmp_path / "out")
    assert "run `trtspec quantize` first" in exc.value.hint


def test_checkpoint_split_for_another_tp_size_is_refused(tmp_path, tiny_pair, trtllm_checkpoints, with_standin):
    spec = engine_spec(tmp_path, tiny_pair, target={"tp_size": 2}, gpu={"count": 2})
    _place_checkpoints(spec, trtllm_checkpoints)
    with pytest.raises(EngineBuildError, match="tp_size 1, spec says target.tp_size 2"):
        compile_into(spec, "target", tmp_path / "out")


def _without_trtllm_build(monkeypatch):
    path = os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(p, "trtllm-build"))
    )
    monkeypatch.setenv("PATH", path)


def test_without_trtllm_build_the_error_carries_the_docker_command(
    tmp_path, tiny_pair, trtllm_checkpoints, monkeypatch
):
    _without_trtllm_build(monkeypatch)
    spec = engine_spec(tmp_path, tiny_pair)
    _place_checkpoints(spec, trtllm_checkpoints)
    with pytest.raises(EngineBuildError) as exc:
        compile_into(spec, "target", tmp_path / "out")
    assert "trtllm-build is not on PATH" in exc.value.message and "\n" not in exc.value.message
    line = exc.value.hint.split(": ", 1)[1]
    argv = shlex.split(line)
    assert argv[:3] == ["docker", "run", "--rm"] and "--gpus" in argv
    assert "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3" in argv
    ckpt, out = checkpoint_dir(spec, "target"), engine_dir(spec, "target")
    assert f"{ckpt}:{ckpt}:ro" in argv and f"{out.parent}:{out.parent}" in argv
    inner = argv[argv.index("trtllm-build") :]
    assert inner == trtllm_build_command(spec, "target", ckpt, out)


def test_engine_built_by_the_docker_command_is_adopted(
    tmp_path, tiny_pair, trtllm_checkpoints, standin_bin, monkeypatch
):
    _without_trtllm_build(monkeypatch)
    spec = engine_spec(tmp_path, tiny_pair)
    _place_checkpoints(spec, trtllm_checkpoints)
    for role in ("target", "draft"):  # what `docker run ... trtllm-build ...` does, with the stand-in inside
        argv = docker_command(spec, role)
        inner = argv[argv.index("trtllm-build") :]
        subprocess.run(
            [str(standin_bin / "trtllm-build"), *inner[1:]],
            check=True,
            capture_output=True,
            env={**os.environ, "TRTLLM_STANDIN_VERSION": "1.0.0"},
        )
    report = run_pipeline(spec, only=["compile:target", "compile:draft"])
    assert [s.status for s in report.stages] == ["built", "built"]
    manifest = json.loads((engine_dir(spec, "target") / "manifest.json").read_text())
    assert manifest["built_by"].startswith("external") and manifest["engine"]["max_draft_len"] == 4
    again = run_pipeline(spec, only=["compile:target", "compile:draft"])
    assert [s.status for s in again.stages] == ["skipped", "skipped"]


def test_cli_compile_without_trtllm_build_exits_1_with_docker_lines(tmp_path, tiny_pair, trtllm_checkpoints):
    spec = engine_spec(tmp_path, tiny_pair)
    _place_checkpoints(spec, trtllm_checkpoints)
    path = tmp_path / "trtspec.yaml"
    path.write_text(yaml.safe_dump(spec.to_yaml_dict()))
    env = {
        **os.environ,
        "PATH": os.pathsep.join(
            p for p in os.environ["PATH"].split(os.pathsep) if not os.path.exists(os.path.join(p, "trtllm-build"))
        ),
    }
    r = subprocess.run(
        [sys.executable, "-m", "trtspec", "compile", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "error: trtllm-build is not on PATH" in r.stderr
    assert r.stderr.count("docker run --rm --gpus all") >= 2  # one line per role, then the hint


def test_cli_compile_with_trtllm_build_builds_then_skips(tmp_path, tiny_pair, trtllm_checkpoints, standin_bin):
    spec = engine_spec(tmp_path, tiny_pair)
    _place_checkpoints(spec, trtllm_checkpoints)
    path = tmp_path / "trtspec.yaml"
    path.write_text(yaml.safe_dump(spec.to_yaml_dict()))
    env = {**os.environ, "PATH": f"{standin_bin}{os.pathsep}{os.environ['PATH']}", "TRTLLM_STANDIN_VERSION": "1.0.0"}
    r = subprocess.run(
        [sys.executable, "-m", "trtspec", "compile", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "compile:target" in r.stderr and "built" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "trtspec", "compile", str(path), "--only", "draft", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert [s["status"] for s in json.loads(r.stdout)["stages"]] == ["skipped"]
