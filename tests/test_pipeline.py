"""`trtspec build` orchestration: resume, partial rebuilds, kills mid-stage, the version guard before the repo.

The compile stage is the real one (running the trtllm-build STAND-IN); in most tests quantize and repo are small
stand-in bodies from tests/engine_helpers.py. The ``test_real_stages_*`` tests run every real stage on the tiny pair,
one per runtime (the stand-in builds only the engines; what they check is what quantize and repo wrote).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.engine_helpers import TinyStageBodies, engine_spec
from tests.serving_helpers import default_sigint
from trtspec.build.layout import engine_dir
from trtspec.errors import EngineBuildError, SpecError
from trtspec.pipeline import run_pipeline

OUTPUT_STAGES = ["quantize:target", "quantize:draft", "quality", "compile:target", "compile:draft", "repo"]


TARGET_ENGINE_AND_REPO_REBUILT = {
    "check": "passed",
    "quantize:target": "skipped",
    "quantize:draft": "skipped",
    "quality": "skipped",
    "compile:target": "built",
    "compile:draft": "skipped",
    "repo": "built",
}


def _statuses(report):
    return {s.name: s.status for s in report.stages}


def test_second_build_skips_every_stage(tmp_path, tiny_pair, trtllm_checkpoints, with_standin):
    spec = engine_spec(tmp_path, tiny_pair)
    bodies = TinyStageBodies(trtllm_checkpoints)
    first = run_pipeline(spec, bodies=bodies.bodies())
    assert _statuses(first) == {"check": "passed", **{s: "built" for s in OUTPUT_STAGES}}
    manifests = {
        s: json.loads((Path(r.output) / "manifest.json").read_text())
        for s, r in ((r.name, r) for r in first.stages)
        if r.output and Path(r.output).is_dir()
    }
    second = run_pipeline(spec, bodies=bodies.bodies())
    assert _statuses(second) == {"check": "passed", **{s: "skipped" for s in OUTPUT_STAGES}}
    assert bodies.calls == ["quantize:target", "quantize:draft", "repo"]  # nothing ran twice
    for s, r in ((r.name, r) for r in second.stages if r.output and Path(r.output).is_dir()):
        assert json.loads((Path(r.output) / "manifest.json").read_text()) == manifests[s]
    repo_cfg = (spec.repo_dir / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'string_value: "/engines/target"' in repo_cfg and "${" not in repo_cfg


def test_deleting_one_output_reruns_that_stage_and_the_ones_after(
    tmp_path, tiny_pair, trtllm_checkpoints, with_standin
):
    spec = engine_spec(tmp_path, tiny_pair)
    bodies = TinyStageBodies(trtllm_checkpoints)
    run_pipeline(spec, bodies=bodies.bodies())
    shutil.rmtree(engine_dir(spec, "target"))
    report = run_pipeline(spec, bodies=bodies.bodies())
    assert _statuses(report) == TARGET_ENGINE_AND_REPO_REBUILT


def test_changing_the_draft_length_rebuilds_only_the_target_engine_and_the_repo(
    tmp_path, tiny_pair, trtllm_checkpoints, with_standin
):
    bodies = TinyStageBodies(trtllm_checkpoints)
    run_pipeline(engine_spec(tmp_path, tiny_pair), bodies=bodies.bodies())
    spec = engine_spec(tmp_path, tiny_pair, speculative={"max_draft_len": 8})
    report = run_pipeline(spec, bodies=bodies.bodies())
    assert _statuses(report) == TARGET_ENGINE_AND_REPO_REBUILT
    manifest = json.loads((engine_dir(spec, "target") / "manifest.json").read_text())
    assert manifest["engine"]["max_draft_len"] == 8


def _write_spec(tmp_path, spec) -> Path:
    path = tmp_path / "trtspec.yaml"
    path.write_text(yaml.safe_dump(spec.to_yaml_dict()))
    return path


def _start_runner(tmp_path, spec, checkpoints, sleep: str) -> subprocess.Popen:
    env = {**os.environ, "TRTLLM_STANDIN_SLEEP": sleep, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "pipeline_runner.py"),
            str(_write_spec(tmp_path, spec)),
            json.dumps({k: str(v) for k, v in checkpoints.items()}),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,
    )


def _wait_for_build_mid_stage(spec, proc, deadline_s: float = 180) -> None:
    """Until the stand-in is building the target engine (its log says so and the temporary output exists)."""
    log = spec.engines_dir / "logs" / "target.trtllm-build.log"
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(f"the build ended early: {proc.communicate()}")
        tmp = [p for p in spec.engines_dir.glob(".tmp-target-*")] if spec.engines_dir.is_dir() else []
        if tmp and log.is_file() and "Building engine for rank 0" in log.read_text():
            return
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("the build never reached the target engine")


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_build_killed_mid_stage_leaves_no_partial_output_and_the_next_run_completes(
    tmp_path, tiny_pair, trtllm_checkpoints, with_standin
):
    spec = engine_spec(tmp_path, tiny_pair)
    proc = _start_runner(tmp_path, spec, trtllm_checkpoints, sleep="600")
    _wait_for_build_mid_stage(spec, proc)
    os.kill(proc.pid, signal.SIGKILL)  # trtspec alone, no cleanup handlers: as after an OOM kill
    proc.wait(timeout=60)
    end = time.monotonic() + 30
    while not _group_gone(proc.pid) and time.monotonic() < end:  # trtllm-build dies with its parent
        time.sleep(0.2)
    assert _group_gone(proc.pid), "trtllm-build kept running after trtspec was killed"
    assert not engine_dir(spec, "target").exists()
    assert list(spec.engines_dir.glob(".tmp-target-*"))  # the half-built engine is only a temporary sibling
    report = run_pipeline(spec, bodies=TinyStageBodies(trtllm_checkpoints).bodies())
    assert _statuses(report)["compile:target"] == "built"
    assert _statuses(report)["quantize:target"] == "skipped"  # finished before the kill
    assert not list(spec.engines_dir.glob(".tmp-*"))  # the next run cleaned what the killed one left
    assert (engine_dir(spec, "target") / "rank0.engine").is_file()


def test_ctrl_c_mid_stage_removes_the_temporary_output_and_stops_trtllm_build(
    tmp_path, tiny_pair, trtllm_checkpoints, with_standin
):
    spec = engine_spec(tmp_path, tiny_pair)
    proc = _start_runner(tmp_path, spec, trtllm_checkpoints, sleep="600")
    _wait_for_build_mid_stage(spec, proc)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends to the foreground group on Ctrl-C
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert not engine_dir(spec, "target").exists()
    assert not list(spec.engines_dir.glob(".tmp-*"))
    end = time.monotonic() + 30
    while not _group_gone(proc.pid) and time.monotonic() < end:
        time.sleep(0.2)
    assert _group_gone(proc.pid), "trtllm-build outlived the interrupted build"


def test_repo_stage_refuses_engines_from_another_trtllm_release_than_the_serving_image(
    tmp_path, tiny_pair, trtllm_checkpoints, with_standin
):
    bodies = TinyStageBodies(trtllm_checkpoints)
    run_pipeline(engine_spec(tmp_path, tiny_pair), bodies=bodies.bodies())  # engines by TRT-LLM 1.0.0
    spec = engine_spec(tmp_path, tiny_pair, triton={"image": "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"})
    with pytest.raises(EngineBuildError) as exc:
        run_pipeline(spec, only=["repo"], bodies=bodies.bodies())
    assert "engines/target was built by TensorRT-LLM 1.0.0" in exc.value.message
    assert "serves 1.1.0" in exc.value.message and "1.1.0" in exc.value.hint
    ok = engine_spec(tmp_path, tiny_pair, triton={"image": "nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3"})
    assert _statuses(run_pipeline(ok, only=["repo"], bodies=bodies.bodies()))["repo"] == "built"


def test_torch_runtime_without_quantization_needs_only_the_repo_stage(tmp_path, tiny_pair, trtllm_checkpoints):
    spec = engine_spec(
        tmp_path,
        tiny_pair,
        runtime="torch",
        target={"quantization": "none", "dtype": "float32"},
        draft={"quantization": "none", "dtype": "float32"},
    )
    bodies = TinyStageBodies(trtllm_checkpoints)
    report = run_pipeline(spec, bodies=bodies.bodies())
    assert _statuses(report) == {
        "check": "passed",
        "quantize:target": "not needed",
        "quantize:draft": "not needed",
        "quality": "not needed",
        "compile:target": "not needed",
        "compile:draft": "not needed",
        "repo": "built",
    }
    assert _statuses(run_pipeline(spec, bodies=bodies.bodies()))["repo"] == "skipped"


def test_failed_preflight_stops_before_any_stage(tmp_path, tiny_pair, trtllm_checkpoints):
    spec = engine_spec(tmp_path, tiny_pair, engine={"max_seq_len": 8192, "max_input_len": 256})  # > 4096 positions
    bodies = TinyStageBodies(trtllm_checkpoints)
    with pytest.raises(SpecError, match="preflight check failed"):
        run_pipeline(spec, bodies=bodies.bodies())
    assert bodies.calls == [] and not spec.engines_dir.exists()


def test_unknown_stage_is_a_one_line_error(tmp_path, tiny_pair):
    spec = engine_spec(tmp_path, tiny_pair)
    with pytest.raises(SpecError, match="no stage named compile:tokenizer"):
        run_pipeline(spec, only=["compile:tokenizer"])


def test_standalone_repo_and_serve_docker_run_the_version_guard(tmp_path, tiny_pair, trtllm_checkpoints, with_standin):
    """`trtspec repo` (the real writer) and `serve --docker IMAGE` refuse engines of another TensorRT-LLM release."""
    from trtspec.pipeline import write_repo
    from trtspec.trtllm.engine_dir import check_repo_engines

    bodies = TinyStageBodies(trtllm_checkpoints)
    spec = engine_spec(tmp_path, tiny_pair)  # engines by TRT-LLM 1.0.0
    run_pipeline(
        spec,
        only=["check", "quantize:target", "quantize:draft", "compile:target", "compile:draft"],
        bodies=bodies.bodies(),
    )
    other = engine_spec(tmp_path, tiny_pair, triton={"image": "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"})
    with pytest.raises(EngineBuildError, match="built by TensorRT-LLM 1.0.0"):
        write_repo(other)
    assert not spec.repo_dir.exists()
    result = write_repo(spec)  # the table's image for 1.0.0
    repo = result["path"]
    assert result["manifest"]["settings"]["engine_trtllm_versions"] == {"target": "1.0.0", "draft": "1.0.0"}
    assert set(check_repo_engines(repo, "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3").values()) == {"1.0.0"}
    with pytest.raises(EngineBuildError, match="ships 1.1.0"):
        check_repo_engines(repo, "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3")
    with pytest.raises(EngineBuildError, match="not an NGC tritonserver trtllm image"):
        check_repo_engines(repo, "my-registry/custom:latest")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cli = [sys.executable, "-m", "trtspec", "serve", str(repo), "--dry-run", "--docker"]
    r = subprocess.run(
        cli + ["nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1 and "ships 1.1.0" in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        cli + ["nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert f"-v {engine_dir(spec, 'target')}:/engines/target:ro" in r.stdout.replace("\n", "")


def test_a_second_build_or_quantize_of_the_same_spec_is_refused_while_one_runs(tmp_path, tiny_pair):
    from trtspec.build.artifacts import build_lock
    from trtspec.pipeline import quantize_models

    spec = engine_spec(tmp_path, tiny_pair)
    with build_lock(spec.build_dir):
        with pytest.raises(SpecError, match="another trtspec build of this spec is running"):
            run_pipeline(spec, only=["check"])
        with pytest.raises(SpecError, match="another trtspec build of this spec is running"):
            quantize_models(spec)
    assert _statuses(run_pipeline(spec, only=["check"])) == {"check": "passed"}  # released


# -- the real quantize and repo stages, one runtime each -------------------------------------------------------------
REAL_RUNTIMES = {
    # runtime: (target quantization, draft quantization, dtype); formats ModelOpt quantizes on a CPU
    "torch": ("fp8", "int8_wo", "float32"),
    "trtllm-llmapi": ("fp8", "int8_wo", "float32"),
    "trtllm-engine": ("fp8", "fp8", "float16"),
}


def _quant_algo(spec, role) -> str | None:
    from trtspec.build.layout import checkpoint_dir
    from trtspec.spec import Runtime

    ckpt = checkpoint_dir(spec, role)
    if spec.runtime is Runtime.TRTLLM_ENGINE:  # a TensorRT-LLM checkpoint
        return json.loads((ckpt / "config.json").read_text())["quantization"]["quant_algo"]
    return json.loads((ckpt / "hf_quant_config.json").read_text())["quantization"]["quant_algo"]


@pytest.mark.parametrize("runtime", sorted(REAL_RUNTIMES))  # about 5-7 s each on a CPU
def test_real_stages_build_then_skip(tmp_path, tiny_pair, runtime, request):
    from trtspec.build.formats import Quantization, get_format
    from trtspec.build.layout import ROLES, checkpoint_dir
    from trtspec.triton_repo.definitions import repository_models
    from trtspec.triton_repo.pbtxt import parse
    from trtspec.triton_repo.validate import validate_repo

    if runtime == "trtllm-engine":
        request.getfixturevalue("with_standin")  # trtllm-build cannot run here: the stand-in builds the engines
    target_q, draft_q, dtype = REAL_RUNTIMES[runtime]
    spec = engine_spec(
        tmp_path,
        tiny_pair,
        runtime=runtime,
        target={"quantization": target_q, "dtype": dtype},
        draft={"quantization": draft_q, "dtype": dtype},
    )
    first = run_pipeline(spec)  # every body the real one
    engines = runtime == "trtllm-engine"
    compiled = "built" if engines else "not needed"
    assert _statuses(first) == {
        "check": "passed",
        "quantize:target": "built",
        "quantize:draft": "built",
        "quality": "built",
        "compile:target": compiled,
        "compile:draft": compiled,
        "repo": "built",
    }
    for role, q in zip(ROLES, (target_q, draft_q)):  # ModelOpt's checkpoints, with the spec's quantization
        manifest = json.loads((checkpoint_dir(spec, role) / "manifest.json").read_text())
        assert manifest["stage"] == f"quantize:{role}" and manifest["format"] == q
        assert manifest["export"] == ("trtllm-checkpoint" if engines else "hf-checkpoint")
        assert _quant_algo(spec, role) == get_format(Quantization(q)).trtllm_algo
    quality = json.loads((spec.build_dir / "quality.json").read_text())
    assert set(quality["models"]) == {"target", "draft"}
    repo_manifest = json.loads((spec.repo_dir / "manifest.json").read_text())
    models = [m.name for m in repository_models(spec)]
    assert repo_manifest["stage"] == "repo" and repo_manifest["models"] == models
    assert sorted(p.name for p in spec.repo_dir.iterdir() if p.is_dir()) == sorted(models)
    configs = validate_repo(spec.repo_dir)  # parses and cross-checks every config.pbtxt
    assert set(configs) == set(models)
    for name in models:
        assert parse((spec.repo_dir / name / "config.pbtxt").read_text()).name == name
    target_cfg = (spec.repo_dir / "tensorrt_llm" / "config.pbtxt").read_text()
    if engines:
        assert 'backend: "tensorrtllm"' in target_cfg and 'string_value: "/engines/target"' in target_cfg
    elif runtime == "trtllm-llmapi":
        assert models == ["tensorrt_llm"]
        assert "model: /checkpoints/target" in (spec.repo_dir / "tensorrt_llm" / "1" / "model.yaml").read_text()
        mounts = dict(map(tuple, repo_manifest["container_mounts"]))
        assert mounts[str(checkpoint_dir(spec, "target"))] == "/checkpoints/target"  # the quantized checkpoint
    else:
        assert f'string_value: "{checkpoint_dir(spec, "target")}"' in target_cfg  # the quantized checkpoint
    manifests = {p: p.read_text() for p in sorted(tmp_path.rglob("manifest.json"))}
    second = run_pipeline(spec)
    assert {n: s for n, s in _statuses(second).items() if s not in ("passed", "not needed")} == {
        n: "skipped" for n, s in _statuses(first).items() if s == "built"
    }
    assert {p: p.read_text() for p in sorted(tmp_path.rglob("manifest.json"))} == manifests  # nothing rewritten
