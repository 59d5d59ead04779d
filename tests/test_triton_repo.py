"""The Triton repository writer: configs through the ModelConfig schema mirroring TRT-LLM's contracts, validation,
atomic writes with a manifest, and the CLI (`trtspec repo`, `trtspec serve --docker`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.serving_helpers import torch_spec_dict
from trtspec.errors import SpecError, TrtspecError
from trtspec.pipeline import write_repo
from trtspec.spec import spec_from_dict
from trtspec.triton_repo import pbtxt
from trtspec.triton_repo.validate import load_configs, validate_repo

MODELS = {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm_bls", "tensorrt_llm", "tensorrt_llm_draft"}
IN_PROCESS_MODELS = {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm"}

# Upstream TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt: (type, dims[, reshape]).
UPSTREAM_ENSEMBLE_INPUTS = {
    "text_input": ("STRING", [1]),
    "max_tokens": ("INT32", [1]),
    "bad_words": ("STRING", [-1]),
    "stop_words": ("STRING", [-1]),
    "exclude_input_in_output": ("BOOL", [1]),
    "end_id": ("INT32", [1]),
    "pad_id": ("INT32", [1]),
    "top_k": ("INT32", [1]),
    "top_p": ("FP32", [1]),
    "temperature": ("FP32", [1]),
    "seed": ("UINT64", [1]),
    "return_perf_metrics": ("BOOL", [1]),
    "stream": ("BOOL", [1]),
}
UPSTREAM_ENSEMBLE_OUTPUTS = {
    "text_output": ("STRING", [-1]),
    "acceptance_rate": ("FP32", [1]),
    "total_accepted_draft_tokens": ("INT32", [1]),
    "total_draft_tokens": ("INT32", [1]),
    "num_input_tokens": ("INT32", [1]),
    "num_output_tokens": ("INT32", [1]),
    "arrival_time_ns": ("INT64", [1]),
    "first_token_time_ns": ("INT64", [1]),
    "last_token_time_ns": ("INT64", [1]),
}
UPSTREAM_BLS_SPEC_INPUTS = {"num_draft_tokens": ("INT32", [1]), "use_draft_logits": ("BOOL", [1])}
UPSTREAM_ENGINE_INPUTS = {
    "input_ids": ("INT32", [-1], None),
    "input_lengths": ("INT32", [1], []),
    "request_output_len": ("INT32", [1], []),
    "draft_input_ids": ("INT32", [-1], None),
    "draft_logits": ("FP32", [-1, -1], None),
    "end_id": ("INT32", [1], []),
    "pad_id": ("INT32", [1], []),
    "stop_words_list": ("INT32", [2, -1], None),
    "bad_words_list": ("INT32", [2, -1], None),
    "temperature": ("FP32", [1], []),
    "runtime_top_k": ("INT32", [1], []),
    "runtime_top_p": ("FP32", [1], []),
    "seed": ("UINT64", [1], []),
    "return_generation_logits": ("BOOL", [1], []),
    "exclude_input_in_output": ("BOOL", [1], []),
    "streaming": ("BOOL", [1], []),
    "beam_width": ("INT32", [1], []),
}
UPSTREAM_ENGINE_OUTPUTS = {
    "output_ids": ("INT32", [-1, -1]),
    "sequence_length": ("INT32", [-1]),
    "generation_logits": ("FP32", [-1, -1, -1]),
    "batch_index": ("INT32", [1]),
}
UPSTREAM_PRE_OUTPUTS = {
    "INPUT_ID": ("INT32", [-1]),
    "REQUEST_INPUT_LEN": ("INT32", [1]),
    "BAD_WORDS_IDS": ("INT32", [2, -1]),
    "STOP_WORDS_IDS": ("INT32", [2, -1]),
    "REQUEST_OUTPUT_LEN": ("INT32", [-1]),
    "OUT_END_ID": ("INT32", [1]),
    "OUT_PAD_ID": ("INT32", [1]),
}


@pytest.fixture
def spec(tiny_pair, tmp_path):
    """The BLS layout (the one runtime trtllm-engine has), with the torch runtime's engine models."""
    return spec_from_dict(torch_spec_dict(*tiny_pair, triton={"orchestration": "bls"}), base_dir=tmp_path, environ={})


def test_torch_runtime_default_is_one_in_process_draft_target_model(tiny_pair, tmp_path):
    spec = spec_from_dict(torch_spec_dict(*tiny_pair), base_dir=tmp_path, environ={})
    configs = validate_repo(write_repo(spec)["path"])
    assert set(configs) == IN_PROCESS_MODELS
    model = configs["tensorrt_llm"]
    params = {k: v.string_value for k, v in model.parameters.items()}
    assert params["model_dir"] == str(tiny_pair[0]) and params["draft_model_dir"] == str(tiny_pair[1])
    assert params["max_draft_len"] == "4" and params["route_threshold"] == "8"
    assert model.backend == "python" and model.model_transaction_policy.decoupled
    inputs = _io(model.input)
    assert inputs["num_draft_tokens"] == ("INT32", [1]) and inputs["use_draft_logits"] == ("BOOL", [1])
    assert {"decoded_length", "is_final", "acceptance_rate", "total_draft_tokens"} <= set(_io(model.output))
    steps = [s.model_name for s in configs["ensemble"].ensemble_scheduling.step]
    assert steps == ["preprocessing", "tensorrt_llm", "postprocessing"]
    ens_in = _io(configs["ensemble"].input)
    for name, expected in {**UPSTREAM_ENSEMBLE_INPUTS, **UPSTREAM_BLS_SPEC_INPUTS}.items():
        assert ens_in[name] == expected, name
    with pytest.raises(SpecError, match="in_process needs runtime torch"):
        spec_from_dict(
            torch_spec_dict(*tiny_pair, runtime="trtllm-engine", triton={"orchestration": "in_process"}),
            base_dir=tmp_path,
            environ={},
        )


def _io(tensors):
    return {t.name: (pbtxt.dtype_name(t.data_type), list(t.dims)) for t in tensors}


def test_repository_has_every_model_and_configs_parse_back(spec):
    result = write_repo(spec)
    repo = result["path"]
    assert not result["skipped"] and repo == spec.repo_dir
    configs = validate_repo(repo)
    assert set(configs) == MODELS
    for name in MODELS - {"ensemble"}:
        assert (repo / name / "1" / "model.py").is_file()
    assert (repo / "ensemble" / "1").is_dir() and configs["ensemble"].platform == "ensemble"
    manifest = json.loads((repo / "manifest.json").read_text())
    assert manifest["inputs_hash"] and set(manifest["models"]) == MODELS
    assert str(spec.model_path("target")) in manifest["external_paths"]


def test_tensors_mirror_the_trtllm_backend_contracts(spec):
    configs = validate_repo(write_repo(spec)["path"])
    ens_in, ens_out = _io(configs["ensemble"].input), _io(configs["ensemble"].output)
    for name, expected in {**UPSTREAM_ENSEMBLE_INPUTS, **UPSTREAM_BLS_SPEC_INPUTS}.items():
        assert ens_in[name] == (expected[0], expected[1]), name
    assert {n: ens_out[n] for n in UPSTREAM_ENSEMBLE_OUTPUTS} == UPSTREAM_ENSEMBLE_OUTPUTS
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        cfg = configs[model]
        inputs = {t.name: t for t in cfg.input}
        for name, (dtype, dims, reshape) in UPSTREAM_ENGINE_INPUTS.items():
            t = inputs[name]
            assert (pbtxt.dtype_name(t.data_type), list(t.dims)) == (dtype, dims), name
            if reshape is not None:
                assert t.HasField("reshape") and list(t.reshape.shape) == reshape, name
        assert {n: _io(cfg.output)[n] for n in UPSTREAM_ENGINE_OUTPUTS} == UPSTREAM_ENGINE_OUTPUTS
        assert cfg.model_transaction_policy.decoupled and cfg.backend == "python"
    assert {n: _io(configs["preprocessing"].output)[n] for n in UPSTREAM_PRE_OUTPUTS} == UPSTREAM_PRE_OUTPUTS
    bls = configs["tensorrt_llm_bls"]
    assert bls.parameters["tensorrt_llm_model_name"].string_value == "tensorrt_llm"
    assert bls.parameters["tensorrt_llm_draft_model_name"].string_value == "tensorrt_llm_draft"
    assert bls.parameters["route_threshold"].string_value == "8" and bls.model_transaction_policy.decoupled


def test_max_batch_size_zero_is_written_explicitly_and_unknown_fields_are_rejected():
    cfg = pbtxt.new_config("m", backend="python", max_batch_size=0)
    text = pbtxt.serialize(cfg)
    assert "max_batch_size: 0" in text and pbtxt.parse(text) == cfg
    with pytest.raises(TrtspecError, match="not a valid Triton model config"):
        pbtxt.parse(text + "no_such_field: 1\n")


def test_validation_catches_a_miswired_ensemble(spec):
    repo = write_repo(spec)["path"]
    path = repo / "ensemble" / "config.pbtxt"
    text = path.read_text()
    # Preprocessing's INPUT_ID now lands in another tensor: the orchestrator's input_ids reads nothing.
    path.write_text(text.replace('value: "_INPUT_ID"', 'value: "_ELSEWHERE"', 1))
    with pytest.raises(TrtspecError, match="input_ids reads '_INPUT_ID', which nothing produces"):
        validate_repo(repo)
    path.write_text(text.replace('key: "OUTPUT"', 'key: "NO_SUCH_OUTPUT"'))
    with pytest.raises(TrtspecError, match="postprocessing has no output 'NO_SUCH_OUTPUT'"):
        validate_repo(repo)


def test_up_to_date_repository_is_kept_and_a_changed_spec_rewrites_it(spec, tiny_pair, tmp_path):
    first = write_repo(spec)
    assert write_repo(spec)["skipped"]
    changed = spec_from_dict(
        torch_spec_dict(*tiny_pair, speculative={"max_draft_len": 6}, triton={"orchestration": "bls"}),
        base_dir=tmp_path,
        environ={},
    )
    again = write_repo(changed)
    assert not again["skipped"] and again["manifest"]["inputs_hash"] != first["manifest"]["inputs_hash"]
    cfg = load_configs(again["path"])["tensorrt_llm_bls"]
    assert cfg.parameters["max_draft_len"].string_value == "6"


def test_a_failed_write_leaves_no_repository(tiny_pair, tmp_path):
    bad = spec_from_dict(torch_spec_dict(tiny_pair[0], tmp_path / "missing-draft"), base_dir=tmp_path, environ={})
    with pytest.raises(SpecError, match="does not exist"):
        write_repo(bad)
    assert not bad.repo_dir.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_engine_runtime_swaps_only_the_two_engine_models(tiny_pair, tmp_path):
    """runtime trtllm-engine: backend tensorrtllm definitions (engines branch) for tensorrt_llm / tensorrt_llm_draft,
    everything else identical. The writer only references the engines and the checkpoint, and reads the release an
    engine was built by (the version guard): a config.json and an empty rank0.engine stand in for each engine."""
    from tests.engine_helpers import copy_tokenizer
    from trtspec.build.layout import checkpoint_dir, engine_dir

    data = torch_spec_dict(*tiny_pair, runtime="trtllm-engine")
    data["target"]["dtype"] = data["draft"]["dtype"] = "bfloat16"
    spec = spec_from_dict(data, base_dir=tmp_path, environ={})
    for role in ("target", "draft"):
        engine_dir(spec, role).mkdir(parents=True)
        (engine_dir(spec, role) / "config.json").write_text(
            json.dumps({"version": spec.engine.trtllm_version, "build_config": {}, "pretrained_config": {}})
        )
        (engine_dir(spec, role) / "rank0.engine").write_bytes(b"")
    copy_tokenizer(tiny_pair[0], checkpoint_dir(spec, "target"))  # the quantize stage saves it with the checkpoint
    torch_configs = load_configs(
        write_repo(
            spec_from_dict(
                torch_spec_dict(*tiny_pair, triton={"orchestration": "bls"}), base_dir=tmp_path / "t", environ={}
            )
        )["path"]
    )
    result = write_repo(spec)
    configs = validate_repo(result["path"])
    assert set(configs) == MODELS
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        cfg = configs[name]
        assert cfg.backend == "tensorrtllm" and cfg.model_transaction_policy.decoupled
        assert cfg.parameters["gpt_model_path"].string_value.startswith("/engines/")
        assert not (result["path"] / name / "1" / "model.py").exists()
    assert configs["ensemble"] == torch_configs["ensemble"]
    manifest = result["manifest"]
    assert [str(engine_dir(spec, "target")), "/engines/target"] in [list(m) for m in manifest["container_mounts"]]
    assert manifest["server_env"] == {"TRTLLM_ORCHESTRATOR": "1"}


def test_llmapi_repository_for_a_release_before_1_0_is_refused_and_nothing_is_left(tiny_pair, tmp_path):
    spec = spec_from_dict(
        torch_spec_dict(*tiny_pair, runtime="trtllm-llmapi", engine={"trtllm_version": "0.21.0"}),
        base_dir=tmp_path,
        environ={},
    )
    with pytest.raises(SpecError, match="trtllm-llmapi needs TensorRT-LLM >= 1.0"):
        write_repo(spec)
    assert not spec.repo_dir.exists() and not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


def test_model_sources_are_package_data():
    from pathlib import Path

    import tomllib

    from trtspec.triton_repo.definitions import MODELS_DIR

    patterns = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["trtspec"]
    sources = sorted(p.relative_to(MODELS_DIR.parent.parent) for p in MODELS_DIR.glob("*/model.py"))
    assert len(sources) == 6  # pre, post, orchestrator, torch engine, torch in-process draft-target, llmapi
    assert all(any(p.match(pattern) for pattern in patterns) for p in sources)


def _cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "trtspec", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=300,
    )


def test_cli_repo_writes_and_serve_docker_shows_the_container_command(tiny_pair, tmp_path):
    (tmp_path / "trtspec.yaml").write_text(yaml.safe_dump(torch_spec_dict(*tiny_pair)))
    r = _cli("repo", "trtspec.yaml", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["path"] == str(tmp_path / "triton_repo") and set(out["models"]) == IN_PROCESS_MODELS
    r = _cli(
        "serve",
        "triton_repo",
        "--docker",
        "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3",
        "--http-port",
        "9000",
        "--dry-run",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.replace("\n", "")
    assert cmd.startswith("docker run --rm --init --gpus all")
    # published on the --host address only (loopback by default), not on every interface
    assert f"-v {tmp_path / 'triton_repo'}:/models:ro" in cmd and "-p 127.0.0.1:9000:8000" in cmd
    assert "-p 127.0.0.1:8001:8001" in cmd and "-p 127.0.0.1:8002:8002" in cmd and " 8000:8000" not in cmd
    assert f"-v {tiny_pair[0]}:{tiny_pair[0]}:ro" in cmd  # configs hold absolute paths: mounted as they are
    assert "TRTSPEC_PYTHONPATH=/opt/trtspec" in cmd and "tritonserver --model-repository=/models" in cmd
    r = _cli("serve", "nowhere", cwd=tmp_path)
    assert r.returncode == 1 and "no such model repository" in r.stderr and "Traceback" not in r.stderr
    # --http-port 0 with --docker: a port free now on the chosen address, published there (not 0, not 8000)
    image = "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3"
    r = _cli(
        "serve", "triton_repo", "--docker", image, "--host", "0.0.0.0", "--http-port", "0", "--dry-run", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    (published,) = re.findall(r"-p 0\.0\.0\.0:(\d+):8000", r.stdout.replace("\n", ""))
    assert int(published) not in (0, 8000) and "-p 0.0.0.0:8001:8001" in r.stdout.replace("\n", "")


def test_cli_repo_on_a_missing_model_is_one_line(tiny_pair, tmp_path):
    (tmp_path / "trtspec.yaml").write_text(yaml.safe_dump(torch_spec_dict(tiny_pair[0], tmp_path / "gone")))
    r = _cli("repo", "trtspec.yaml", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "hint:" in r.stderr
