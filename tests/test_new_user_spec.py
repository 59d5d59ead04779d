"""A new user's first commands (issue 13): `init` for GPU runtimes writes GPU dtypes and formats the models take, and
`check` and `plan` agree with it; `check` on a CPU plans this machine's RAM, not a GPU's; it reads calibration.file;
spec errors say who set a field and what was probably meant."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

TRTSPEC = [sys.executable, "-m", "trtspec"]


def run(*args, cwd=None, env=None, timeout=300):
    return subprocess.run(
        [*TRTSPEC, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def narrow_draft(tiny_tokenizer, tmp_path_factory):
    """A draft of hidden 96: 4-bit formats (blocks of 128) cannot take it."""
    from tests.tiny import make_llama

    return make_llama(
        tmp_path_factory.mktemp("narrow") / "draft", tiny_tokenizer, hidden=96, intermediate=192, layers=1, seed=2
    )


def _written(path):
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("runtime", ["trtllm-engine", "trtllm-llmapi"])
def test_init_for_a_gpu_runtime_writes_gpu_dtypes_and_formats_that_fit(tmp_path, tiny_pair, narrow_draft, runtime):
    r = run(
        "init",
        "--target",
        str(tiny_pair[0]),
        "--draft",
        str(narrow_draft),
        "--runtime",
        runtime,
        "-o",
        "spec.yaml",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    spec = _written(tmp_path / "spec.yaml")
    assert spec["target"]["dtype"] == spec["draft"]["dtype"] == "bfloat16"
    assert spec["target"]["quantization"] == "fp8"
    assert spec["draft"]["quantization"] == "fp8"  # int4_awq, the first choice, needs multiples of 128
    text = (tmp_path / "spec.yaml").read_text()
    assert "# chosen: fp8, the best format this draft takes" in text
    assert "int4_awq needs input dimensions that are multiples of 128, hidden_size is 96" in text
    assert "int4_awq needs" in r.stdout  # said on the terminal too
    check = run("check", "spec.yaml", "--json", cwd=tmp_path)
    report = json.loads(check.stdout)
    assert check.returncode == 0 and report["ok"], check.stdout + check.stderr
    levels = {f["check"]: f["level"] for f in report["findings"]}
    assert levels["draft quantization"] == levels["target quantization"] == "ok"
    assert "draft dtype" not in levels and "target dtype" not in levels
    plan = json.loads(run("plan", "spec.yaml", "--json", cwd=tmp_path).stdout)
    stages = {s["name"]: s for s in plan["stages"]}
    assert "ModelOpt PTQ fp8" in stages["quantize:draft"]["action"]
    assert plan["spec"]["draft"]["dtype"] == "bfloat16"


def test_init_picks_4bit_for_a_draft_that_takes_it_and_relative_paths_stay_right(tmp_path, tiny_pair):
    (tmp_path / "models").symlink_to(tiny_pair[0].parent)
    (tmp_path / "out").mkdir()
    r = run(
        "init",
        "--target",
        "models/target",
        "--draft",
        "models/draft",
        "--runtime",
        "trtllm-engine",
        "-o",
        "out/spec.yaml",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    spec = _written(tmp_path / "out" / "spec.yaml")
    assert spec["draft"]["quantization"] == "int4_awq" and spec["target"]["quantization"] == "fp8"
    assert spec["target"]["model"] == "../models/target"  # resolves against the spec file's directory
    assert run("check", "out/spec.yaml", cwd=tmp_path).returncode == 0


def test_a_float32_spec_on_a_gpu_runtime_is_warned(tmp_path, tiny_pair, write_spec):
    path = write_spec(
        {
            "runtime": "trtllm-engine",
            "target": {"model": str(tiny_pair[0]), "dtype": "float32"},
            "draft": {"model": str(tiny_pair[1])},
        }
    )
    report = json.loads(run("check", str(path), "--json").stdout)
    found = {f["check"]: f for f in report["findings"]}
    assert found["target dtype"]["level"] == "warn" and "bfloat16" in found["target dtype"]["hint"]


def test_check_on_the_torch_runtime_plans_this_machines_memory_not_a_gpu(tmp_path, tiny_pair, write_spec):
    path = write_spec({"target": {"model": str(tiny_pair[0])}, "draft": {"model": str(tiny_pair[1])}})
    r = run("check", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "GPU memory" not in r.stdout and "GiB left for KV" not in r.stdout
    assert "host memory" in r.stdout and "RAM" in r.stdout
    report = json.loads(run("check", str(path), "--json").stdout)
    assert report["memory"] is None and report["host_memory"]["total_bytes"] > 0


def test_check_does_not_warn_about_a_family_the_torch_runtime_runs(tmp_path, tiny_pair):
    import shutil

    draft = tmp_path / "custom"
    shutil.copytree(tiny_pair[1], draft)
    cfg = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**cfg, "model_type": "trtspec_draft"}))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"target": {"model": str(tiny_pair[0])}, "draft": {"model": str(draft)}}))
    found = {f["check"]: f for f in json.loads(run("check", str(spec), "--json").stdout)["findings"]}
    assert found["draft family"]["level"] == "ok" and "torch runtime" in found["draft family"]["detail"]
    spec.write_text(
        yaml.safe_dump(
            {"runtime": "trtllm-engine", "target": {"model": str(tiny_pair[0])}, "draft": {"model": str(draft)}}
        )
    )
    r = run("check", str(spec))
    assert r.returncode == 1 and "draft family" in r.stderr


def test_check_refuses_a_missing_calibration_file_and_build_leaves_nothing(tmp_path, tiny_pair):
    spec = tmp_path / "s.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "target": {"model": str(tiny_pair[0]), "quantization": "int8_wo"},
                "draft": {"model": str(tiny_pair[1])},
                "calibration": {"file": "nowhere.jsonl"},
            }
        )
    )
    r = run("check", str(spec))
    assert r.returncode == 1 and "calibration" in r.stderr and "nowhere.jsonl: calibration file not found" in r.stderr
    before = set(tmp_path.iterdir())
    r = run("build", str(spec), cwd=tmp_path)
    assert r.returncode == 1 and "preflight check failed: calibration" in r.stderr and "Traceback" not in r.stderr
    assert set(tmp_path.iterdir()) == before  # no build/, no .trtspec-build.lock
    (tmp_path / "nowhere.jsonl").write_text('{"txt": "no text field"}\n')
    r = run("check", str(spec))
    assert r.returncode == 1 and "no field 'text'" in r.stderr


def test_unused_calibration_file_is_said_to_be_unused(tmp_path, tiny_pair, write_spec):
    path = write_spec(
        {
            "target": {"model": str(tiny_pair[0])},
            "draft": {"model": str(tiny_pair[1])},
            "calibration": {"file": "nowhere.txt"},
        }
    )
    found = {f["check"]: f for f in json.loads(run("check", str(path), "--json").stdout)["findings"]}
    assert found["calibration"]["level"] == "ok" and "nothing is quantized" in found["calibration"]["detail"]


def test_typo_in_a_field_says_did_you_mean(tmp_path, write_spec):
    path = write_spec(
        {"target": {"model": "t", "quantisation": "fp8"}, "draft": {"model": "d"}, "speculatve": {"max_draft_len": 4}}
    )
    r = run("plan", str(path))
    assert r.returncode == 1
    assert "target.quantisation: unknown field; did you mean 'quantization'?" in r.stderr
    path = write_spec({"target": {"model": "t", "quantization": "int4-awq"}, "draft": {"model": "d"}})
    assert "did you mean 'int4_awq'?" in run("plan", str(path)).stderr


def test_an_environment_override_error_names_the_variable_not_the_file(tmp_path, write_spec):
    path = write_spec({"target": {"model": "t"}, "draft": {"model": "d"}})
    r = run("plan", str(path), env={"TRTSPEC_SPEC__DRAFT__QUANTIZATION": "int3"})
    assert r.returncode == 1
    first = r.stderr.splitlines()[0]
    assert first.startswith("error: TRTSPEC_SPEC__DRAFT__QUANTIZATION (environment): draft.quantization: 'int3'")
    assert "trtspec.yaml" not in first and "unset that environment variable" in r.stderr
    r = run("plan", str(path), env={"TRTSPEC_SPEC__ENGINE__MAX_INPUT_LEN": "9000"})
    assert "trtspec.yaml with TRTSPEC_SPEC__ENGINE__MAX_INPUT_LEN from the environment" in r.stderr


@pytest.mark.slow
def test_init_for_gpu_runtimes_on_the_embedded_example(tmp_path, example_paths):
    from trtspec.families import read_config

    r = run("init", "--runtime", "trtllm-engine", "-o", "spec.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    spec = _written(tmp_path / "spec.yaml")
    assert spec["target"]["dtype"] == spec["draft"]["dtype"] == "bfloat16"
    assert spec["target"]["quantization"] == "fp8"
    assert spec["draft"]["quantization"] == "fp8"  # SmolLM2's hidden 576 rules out int4_awq and w4a8_awq
    assert "hidden_size is 576" in (tmp_path / "spec.yaml").read_text()
    report = json.loads(run("check", "spec.yaml", "--json", cwd=tmp_path).stdout)
    errors = [f["check"] for f in report["findings"] if f["level"] == "error"]
    # The shipped draft is trtspec's own architecture until issue 15 makes it a LlamaForCausalLM.
    allowed = [] if read_config(example_paths.draft).model_type == "llama" else ["draft family"]
    assert errors == allowed, report["findings"]
