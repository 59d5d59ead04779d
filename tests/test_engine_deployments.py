"""`trtspec plan --json` and the generated repository for three engine deployments, each checked against upstream's
recorded facts (tests/upstream/): (a) a TP 1 target + draft, greedy; (b) use_draft_logits; (c) a TP 2 target.

The engines come from the trtllm-build STAND-IN (its parser is built from upstream's recorded flags) run on the exact
commands trtspec plans, over placeholder checkpoints; nothing here runs TensorRT-LLM.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from tritonclient.grpc import model_config_pb2 as pb
from typer.testing import CliRunner

from tests.engine_helpers import copy_tokenizer, engine_spec
from tests.upstream import facts
from trtspec.build.layout import checkpoint_dir, engine_dir
from trtspec.trtllm.trtllm_build import trtllm_build_command
from trtspec.trtllm.trtllm_versions import ngc_image

DEPLOYMENTS = {
    "a-tp1-greedy": {},
    "b-draft-logits": {"speculative": {"use_draft_logits": True, "max_draft_len": 6}},
    "c-tp2-target": {"target": {"tp_size": 2}, "gpu": {"count": 2}},
}


def _fake_checkpoint(out: Path, tp: int, tokenizer_from: Path) -> None:
    """A placeholder TensorRT-LLM checkpoint: the config.json keys and rank files trtllm-build reads, no weights, and
    the tokenizer the quantize stage saves with it (the repository copies it)."""
    copy_tokenizer(tokenizer_from, out)
    (out / "config.json").write_text(
        json.dumps(
            {
                "architecture": "LlamaForCausalLM",
                "dtype": "float16",
                "quantization": {"quant_algo": "FP8"},
                "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
            }
        )
    )
    for rank in range(tp):
        (out / f"rank{rank}.safetensors").write_bytes(b"")


def _deploy(tmp_path, tiny_pair, monkeypatch, overrides):
    """Engines built by the stand-in with trtspec's commands, then the repository trtspec writes for them."""
    from tests.standin.trtllm_build_standin import main as standin_build
    from trtspec.pipeline import write_repo

    spec = engine_spec(tmp_path, tiny_pair, **overrides)
    monkeypatch.setenv("TRTLLM_STANDIN_VERSION", spec.engine.trtllm_version)
    for role in ("target", "draft"):
        _fake_checkpoint(checkpoint_dir(spec, role), getattr(spec, role).tp_size, tiny_pair[0])
        cmd = trtllm_build_command(spec, role, checkpoint_dir(spec, role), engine_dir(spec, role))
        assert standin_build(cmd[1:]) == 0, role
    return spec, write_repo(spec)


def _expected_launch(world: int, spawn: bool, gpus: int, repo: str = "/models") -> tuple[list[str], dict[str, str]]:
    """The command line upstream's launch_triton_server.py --multi-model builds, from its recorded facts."""
    f = facts.load("launch_triton_server")
    values = {"repo": repo, "grpc": 8001, "http": 8000, "metrics": 8002}
    argv = list(f["mpirun"])
    for rank in range(world):
        every = [a.format(rank=rank, **values) for a in f["every_rank"]]
        argv += [*f["per_rank_prefix"], "tritonserver", *every[:4]]
        if rank:
            argv += ["--model-control-mode=explicit", "--load-model=tensorrt_llm", "--load-model=tensorrt_llm_draft"]
        if spawn:
            argv += f["multi_model_spawning"]["flags"]
            argv += [f["multi_model_spawning"]["per_gpu"].format(gpu=g) for g in range(gpus)]
        argv += [*every[4:], f["rank_separator"]]
    env = {
        **f["environment"]["multi_model"],
        **f["environment"]["spawn_processes" if spawn else "disable_spawn_processes"],
    }
    return argv, env


def _configs(repo: Path) -> dict[str, pb.ModelConfig]:
    from trtspec.triton_repo.validate import load_configs

    return load_configs(repo)


def _params(cfg: pb.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in cfg.parameters.items()}


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_repository_configs_hold_what_the_backend_reads(tmp_path, tiny_pair, monkeypatch, name):
    spec, result = _deploy(tmp_path, tiny_pair, monkeypatch, DEPLOYMENTS[name])
    configs = _configs(Path(result["path"]))
    template = {t["name"] for t in facts.template(spec.engine.trtllm_version)["outputs"]}
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        cfg = configs[model]
        params = _params(cfg)
        assert cfg.backend == "tensorrtllm"
        assert facts.unguarded_parameters() <= set(params), model
        assert set(facts.perf_outputs()) <= {o.name for o in cfg.output} <= template, model
        assert int(params["max_tokens_in_paged_kv_cache"]) > 0


def test_a_tp1_greedy_pair_launches_as_upstream_multi_model_with_spawned_workers(tmp_path, tiny_pair, monkeypatch):
    from trtspec.serving.docker import docker_command

    spec, result = _deploy(tmp_path, tiny_pair, monkeypatch, DEPLOYMENTS["a-tp1-greedy"])
    repo = Path(result["path"])
    assert result["manifest"]["launch"] == {
        "kind": "trtllm-multi-model",
        "world_size": 1,
        "spawn_processes": True,
        "gpus": 1,
        "engine_models": ["tensorrt_llm", "tensorrt_llm_draft"],
    }
    argv, env = _expected_launch(world=1, spawn=True, gpus=1)
    image = ngc_image(spec.engine.trtllm_version)
    cmd = docker_command(repo, image)
    assert cmd[cmd.index(image) + 1 :] == argv
    for key, value in env.items():
        assert f"{key}={value}" in cmd
    for cfg in _configs(repo).values():
        assert "participant_ids" not in cfg.parameters and "speculative_decoding_fast_logits" not in cfg.parameters


def test_b_draft_logits_engines_gather_generation_logits_and_the_orchestrator_knows(tmp_path, tiny_pair, monkeypatch):
    from trtspec.trtllm.engine_dir import read_engine

    spec, result = _deploy(tmp_path, tiny_pair, monkeypatch, DEPLOYMENTS["b-draft-logits"])
    for role in ("target", "draft"):  # run_dtm_pld.py: both engines, for logits-based acceptance
        assert read_engine(engine_dir(spec, role)).gather_generation_logits, role
    assert read_engine(engine_dir(spec, "target")).max_draft_len == 6
    bls = _params(_configs(Path(result["path"]))["tensorrt_llm_bls"])
    assert bls["engine_generation_logits"] == "true" and bls["engine_max_draft_len"] == "6"
    greedy = engine_spec(tmp_path / "g", tiny_pair)
    from trtspec.triton_repo.definitions import orchestrator

    assert _params(orchestrator(greedy).config)["engine_generation_logits"] == "false"


def test_c_tp2_target_launches_one_rank_per_participant_with_spawning_off(tmp_path, tiny_pair, monkeypatch):
    from trtspec.serving.docker import docker_command

    spec, result = _deploy(tmp_path, tiny_pair, monkeypatch, DEPLOYMENTS["c-tp2-target"])
    repo = Path(result["path"])
    world = 1 + spec.draft.tp_size + spec.target.tp_size  # the draft_target_model README's world size
    argv, env = _expected_launch(world=world, spawn=False, gpus=2)
    image = ngc_image(spec.engine.trtllm_version)
    cmd = docker_command(repo, image)
    assert cmd[cmd.index(image) + 1 :] == argv
    assert "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=0" in cmd and env["TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"] == "0"
    configs = _configs(repo)
    ranks = []
    for model in ("tensorrt_llm_draft", "tensorrt_llm"):
        params = _params(configs[model])
        assert params["speculative_decoding_fast_logits"] == "1"  # kept only with spawning off (the backend)
        ranks += [int(r) for r in params["participant_ids"].split(",")]
    assert ranks == list(range(1, world))  # rank 0 orchestrates; every other rank is one engine's participant
    assert _params(configs["tensorrt_llm"])["gpu_device_ids"] == "0,1"


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_plan_json_shows_the_build_and_launch_commands_upstream_takes(tmp_path, tiny_pair, write_spec, name):
    import yaml

    from tests.standin.trtllm_build_standin import make_parser
    from trtspec.cli.main import app

    spec = engine_spec(tmp_path, tiny_pair, **DEPLOYMENTS[name])
    path = write_spec(yaml.safe_load(yaml.safe_dump(spec.to_yaml_dict())))
    r = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert r.exit_code == 0, r.output
    stages = {s["name"]: s for s in json.loads(r.output)["stages"]}
    parser = make_parser(spec.engine.trtllm_version)
    for role in ("target", "draft"):
        (cmd,) = stages[f"compile:{role}"]["commands"]
        ns = parser.parse_args(cmd[1:])
        assert ns.gather_generation_logits is spec.speculative.use_draft_logits
        assert (ns.workers or 1) == getattr(spec, role).tp_size
    launch = stages["serve"]["commands"][-1]
    env = dict(a.split("=", 1) for a in launch[1 : launch.index("mpirun")])
    tp = spec.target.tp_size
    argv, expected_env = _expected_launch(
        world=1 if tp == 1 else 1 + spec.draft.tp_size + tp, spawn=tp == 1, gpus=spec.gpu.count
    )
    assert launch[0] == "env" and env == expected_env and launch[launch.index("mpirun") :] == argv


def test_the_image_entrypoint_execs_the_same_launch(tmp_path, tiny_pair, monkeypatch):
    """docker/entrypoint.sh serves through `python3 -m trtspec.serving.launch`: it runs the repository's launch with
    its environment and supervises it (a recording `mpirun` stands in for Open MPI here)."""
    import os
    import subprocess
    import sys

    entrypoint = (Path(__file__).parents[1] / "docker" / "entrypoint.sh").read_text()
    # (next to the OpenAI frontend unless TRTSPEC_OPENAI_PORT=0: tests/test_docker_files.py)
    assert 'triton_cmd=(python3 -m trtspec.serving.launch "$repo" "$@")' in entrypoint
    assert 'repo="${TRTSPEC_SPEC__OUTPUT__REPO_DIR:-/models}"' in entrypoint and 'exec "${triton_cmd[@]}"' in entrypoint
    spec, result = _deploy(tmp_path, tiny_pair, monkeypatch, DEPLOYMENTS["c-tp2-target"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "mpirun.json"
    (bin_dir / "mpirun").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, "
        f"open({str(record)!r}, 'w'))\n"
    )
    (bin_dir / "mpirun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": os.getcwd()}
    env.pop("TRTLLM_ORCHESTRATOR", None)
    r = subprocess.run(
        [sys.executable, "-m", "trtspec.serving.launch", str(result["path"]), "--log-verbose=1"],
        env={**env, "TRTSPEC_STUB_WATCH": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr  # the recording mpirun exits at once: the server never got ready
    assert "exited with code 0 before it was ready" in r.stdout
    seen = json.loads(record.read_text())
    argv, expected_env = _expected_launch(world=4, spawn=False, gpus=2, repo=str(result["path"]))
    rank0_end = argv.index(":")
    # Extra arguments go to rank 0, after its control APIs' restriction to a per-pod key (even without the watch).
    restricted = [a for a in seen["argv"] if "restricted" in a]
    key = restricted[0].rsplit("=", 1)[1]
    apis = "model-repository,shared-memory,trace,logging"
    assert restricted == [
        f"--http-restricted-api={apis}:trtspec-repository-key={key}",
        f"--grpc-restricted-protocol={apis}:trtspec-repository-key={key}",
    ]
    assert len(key) == 32 and "--model-control-mode=explicit" not in seen["argv"][: seen["argv"].index(":")]
    argv = argv[: rank0_end - 2] + restricted + ["--log-verbose=1"] + argv[rank0_end - 2 :]
    assert ["mpirun", *seen["argv"]] == argv
    assert seen["env"]["TRTSPEC_CONTROL_DIR"]  # drain and cancellation reach the models (trtspec.triton_repo.control)
    # With the stub watch (the default), rank 0 alone gets explicit model control behind a per-pod key.
    r = subprocess.run(
        [sys.executable, "-m", "trtspec.serving.launch", str(result["path"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ranks = " ".join(json.loads(record.read_text())["argv"]).split(" : ")
    assert "--model-control-mode=explicit --load-model=*" in ranks[0]
    assert "trtspec-repository-key=" in ranks[0] and all("repository-key" not in r for r in ranks[1:])
    assert {k: seen["env"].get(k) for k in expected_env} == expected_env


def test_a_repository_without_launch_settings_is_refused_and_python_repos_launch_plainly(tmp_path):
    from trtspec.errors import ServerError
    from trtspec.serving.launch import launch_command, repo_launch

    (tmp_path / "manifest.json").write_text(json.dumps({"settings": {"runtime": "trtllm-engine"}}))
    with pytest.raises(ServerError, match="does not say how to launch its two engines"):
        repo_launch(tmp_path, "/models")
    (tmp_path / "manifest.json").write_text(json.dumps({"settings": {"runtime": "trtllm-llmapi"}, "launch": {}}))
    with pytest.raises(ServerError, match="does not say how to launch its LLM API model"):
        repo_launch(tmp_path, "/models")  # written before llmapi repositories got upstream's launch
    plain = launch_command({}, "/models")
    assert (
        plain.argv
        == ["tritonserver", "--model-repository=/models", "--grpc-port=8001", "--http-port=8000", "--metrics-port=8002"]
        and plain.env == {}
    )


def _upstream_max_input_len(max_seq_len: int, chunked: bool) -> int:
    """TensorRT-LLM's maxInputLen for trtspec's engines (context FMHA, packed input), from the recorded facts only."""
    f = facts.load("engine_input_limits")
    assert f["max_input_len"]["enable_chunked_context"] == "maxSequenceLen - 1"
    assert f["max_input_len"]["context_fmha_and_packed_input"] == "min(maxSequenceLen - 1, maxNumTokens)"
    return max_seq_len - 1 if chunked else min(max_seq_len - 1, f["max_num_tokens"]["default"])


@pytest.mark.parametrize("max_seq_len", [512, 16384])
def test_long_generations_fit_the_engines_input_cap_every_step(tmp_path, tiny_pair, monkeypatch, max_seq_len):
    """A spec whose max_seq_len exceeds trtllm-build's default max_num_tokens (8192) gets chunked context on both
    engines, so the cap is max_seq_len - 1 and a generation up to max_seq_len never fails part-way; the orchestrator
    checks requests against that cap."""
    from trtspec.errors import GenerationError
    from trtspec.runtimes.inflight.contract import RowRequest
    from trtspec.triton_repo.orchestrator import Deployment, plan_request

    engine = {"max_seq_len": max_seq_len, "max_input_len": min(max_seq_len // 2, 8192)}
    spec, result = _deploy(tmp_path, tiny_pair, monkeypatch, {"engine": engine})
    configs = _configs(Path(result["path"]))
    true_values = set(facts.load("tensorrtllm_backend_parameters")["bool_values"]["true"])
    chunked = {
        m: _params(configs[m]).get("enable_chunked_context") in true_values
        for m in ("tensorrt_llm", "tensorrt_llm_draft")
    }
    need = _upstream_max_input_len(max_seq_len, chunked=False) < max_seq_len - 1
    assert chunked == {"tensorrt_llm": need, "tensorrt_llm_draft": need}
    cap = _upstream_max_input_len(max_seq_len, chunked=need)
    assert cap == max_seq_len - 1  # every sequence the spec allows fits every step
    bls = _params(configs["tensorrt_llm_bls"])
    assert int(bls["engine_max_input_len"]) == cap
    deployment = Deployment(max_seq_len=int(bls["max_seq_len"]), max_input_len=int(bls["engine_max_input_len"]))
    longest = RowRequest(list(range(3, 3 + max_seq_len // 2)), max_seq_len - max_seq_len // 2)
    assert plan_request(longest, deployment).k == 4
    without_chunking = dataclasses.replace(deployment, max_input_len=_upstream_max_input_len(max_seq_len, False))
    if need:
        with pytest.raises(GenerationError, match="maximum input length"):
            plan_request(longest, without_chunking)


@pytest.mark.parametrize("tp", [1, 2])
def test_llmapi_repositories_launch_as_upstreams_llmapi_launch(tmp_path, tiny_pair, tp):
    """`serve --docker`, the image's entrypoint and the pods run an LLM API repository as upstream's docs do
    (launch_triton_server.py --model_repo: one mpirun rank with upstream's per-rank flags), for TP 1 and TP 2 alike:
    the LLM on rank 0 starts its tensor-parallel workers in that MPI world."""
    from trtspec.pipeline import write_repo
    from trtspec.serving.docker import docker_command
    from trtspec.serving.launch import repo_launch

    none = {"quantization": "none", "dtype": "bfloat16"}  # served from the source directories
    spec = engine_spec(
        tmp_path,
        tiny_pair,
        runtime="trtllm-llmapi",
        engine={"trtllm_version": "1.1.0"},
        target={**none, "tp_size": tp},
        draft=none,
        gpu={"count": tp},
    )
    result = write_repo(spec)
    launch_facts, llmapi = facts.load("launch_triton_server"), facts.load("llmapi_launch")
    values = {"repo": "/models", "grpc": 8001, "http": 8000, "metrics": 8002, "rank": 0}
    assert llmapi["launch"]["world_size"] == 1
    expected = [
        *launch_facts["mpirun"],
        *launch_facts["per_rank_prefix"],
        "tritonserver",
        *(a.format(**values) for a in launch_facts["every_rank"]),
        launch_facts["rank_separator"],
    ]
    image = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"
    cmd = docker_command(Path(result["path"]), image)
    assert cmd[cmd.index(image) + 1 :] == expected
    assert not any(a.startswith("TRTLLM_ORCHESTRATOR") for a in cmd)  # llmapi_launch.json: no orchestrator env
    assert repo_launch(Path(result["path"]), "/models").env == llmapi["launch"]["environment"]
    model_yaml = yaml.safe_load((Path(result["path"]) / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["tensor_parallel_size"] == tp
