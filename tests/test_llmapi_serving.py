"""Runtime trtllm-llmapi: the repository trtspec writes (config.pbtxt, model.yaml, trtspec's llmapi model.py) loads in a
real tritonserver and answers through trtspec's client over gRPC and HTTP, streaming and not.

TensorRT-LLM cannot be installed here, so the `tensorrt_llm` package the model imports is the STAND-IN in
tests/standin/llmapi (it checks the LLM API arguments the model builds from model.yaml against the documented
interface and generates with trtspec's torch decoder). The expected text is transformers' own greedy generate.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.engine_helpers import engine_spec
from tests.serving_helpers import make_noisy_draft
from trtspec.serving.client import TritonLLMClient

pytestmark = pytest.mark.triton

STANDIN = Path(__file__).parent / "standin" / "llmapi"
PROMPTS = ["The quick brown fox", "Q: What is the capital of France? A:", "Zürich, naïve café"]
MAX_TOKENS = 12


def _llmapi_spec(root: Path, target: Path, draft: Path, version: str = "1.1.0"):
    none = {"quantization": "none", "dtype": "float16"}
    return engine_spec(
        root,
        (target, draft),
        runtime="trtllm-llmapi",
        engine={"trtllm_version": version},
        target=none,
        draft=none,
        speculative={"max_draft_len": 3},
    )


def test_llmapi_repository_has_one_model_with_model_yaml(tmp_path, tiny_pair):
    from trtspec.pipeline import write_repo
    from trtspec.triton_repo.validate import load_configs

    spec = _llmapi_spec(tmp_path, *tiny_pair)
    result = write_repo(spec)
    repo = Path(result["path"])
    configs = load_configs(repo)
    assert set(configs) == {"tensorrt_llm"}
    cfg = configs["tensorrt_llm"]
    assert cfg.backend == "python" and cfg.max_batch_size == 0 and cfg.model_transaction_policy.decoupled
    assert {i.name for i in cfg.input} >= {"text_input", "streaming", "sampling_param_max_tokens"}
    data = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert data["speculative_config"] == {
        "decoding_type": "DraftTarget",
        "max_draft_len": 3,
        "speculative_model_dir": "/checkpoints/draft",
    }
    assert (repo / "tensorrt_llm" / "1" / "model.py").is_file()
    assert "${" not in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    manifest = result["manifest"]
    assert manifest["entry_model"] == "tensorrt_llm"
    assert dict(manifest["container_mounts"]) == {
        str(tiny_pair[0]): "/checkpoints/target",
        str(tiny_pair[1]): "/checkpoints/draft",
    }


def _serve(tiny_pair, root: Path, spec_metrics: str):
    from trtspec.pipeline import write_repo
    from trtspec.serving.server import TritonServer

    draft = make_noisy_draft(tiny_pair[0], root / "draft")  # accepts part of the time
    spec = _llmapi_spec(root, tiny_pair[0], draft)
    write_repo(spec)
    env = {
        "TRTSPEC_EXTRA_PYTHONPATH": str(STANDIN),
        "TRTLLM_STANDIN_VERSION": "1.1.0",
        "TRTLLM_STANDIN_SPEC_METRICS": spec_metrics,
        "TRTLLM_STANDIN_MOUNTS": f"/checkpoints/target={tiny_pair[0]};/checkpoints/draft={draft}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with TritonServer(spec.repo_dir, log_file=root / "server.log") as server:
            yield server
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def llmapi_served(tiny_pair, tmp_path_factory):
    """Perf metrics filled, as a TensorRT-LLM release with PR #17082 would report them."""
    yield from _serve(tiny_pair, tmp_path_factory.mktemp("llmapi"), "filled")


@pytest.fixture(scope="module")
def hf_greedy(tiny_pair):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_pair[0])
    model = AutoModelForCausalLM.from_pretrained(tiny_pair[0], dtype=torch.float32).eval()

    def text(prompt: str) -> str:
        ids = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                pad_token_id=tok.pad_token_id or 0,
            )
        return tok.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)

    return text


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_llmapi_model_answers_with_the_target_s_greedy_text(llmapi_served, hf_greedy, protocol):
    url = llmapi_served.grpc_url if protocol == "grpc" else llmapi_served.http_url
    drafted = 0
    with TritonLLMClient(url, protocol=protocol) as client:
        for prompt in PROMPTS:
            plain = client.generate(prompt, MAX_TOKENS)
            streamed = client.generate(prompt, MAX_TOKENS, stream=True)
            assert client.contract == "llmapi" and client.model == "tensorrt_llm"
            assert plain.text == hf_greedy(prompt)
            assert streamed.text == plain.text and len([c for c in streamed.chunks if c]) > 1
            drafted += int(plain.stats.get("total_draft_tokens", 0))
    assert drafted > 0  # the draft named in model.yaml's speculative_config proposed tokens
    assert 0 < plain.stats["num_output_tokens"] <= MAX_TOKENS


def test_generate_and_bench_commands_find_the_llmapi_model(llmapi_served, hf_greedy):
    """`trtspec generate --url` and `trtspec bench` detect the llmapi contract (no ensemble on this server)."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trtspec",
            "generate",
            PROMPTS[0],
            "--url",
            llmapi_served.grpc_url,
            "--raw",
            "-n",
            str(MAX_TOKENS),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"] == hf_greedy(PROMPTS[0])
    r = subprocess.run(
        [sys.executable, "-m", "trtspec", "generate", PROMPTS[0], "--url", llmapi_served.grpc_url, "--no-draft"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 1 and "cannot skip the draft" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trtspec",
            "bench",
            "--url",
            llmapi_served.grpc_url,
            "-c",
            "1,2",
            "-n",
            "6",
            "--requests",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    levels = json.loads(r.stdout)["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    modes = [m for lv in levels for m in lv["modes"]]
    assert [m["mode"] for m in modes] == ["speculative", "speculative"]  # no per-request K, so no baseline
    assert all(m["errors"] == 0 and m["output_tokens"] > 0 for m in modes)


def test_llmapi_model_reports_bad_requests_and_keeps_serving(llmapi_served, hf_greedy):
    from trtspec.errors import GenerationError

    with TritonLLMClient(llmapi_served.grpc_url) as client:
        with pytest.raises(GenerationError, match="not supported by the trtllm-llmapi model"):
            client.generate(PROMPTS[0], MAX_TOKENS, end_id=3)
        with pytest.raises(GenerationError, match="top_p must be in"):
            client.generate(PROMPTS[0], MAX_TOKENS, top_p=1.5)
        assert client.generate(PROMPTS[0], MAX_TOKENS).text == hf_greedy(PROMPTS[0])


def test_zeroed_speculative_metrics_are_reported_as_unavailable_never_as_zero(tiny_pair, tmp_path, hf_greedy):
    """Releases up to 1.2 leave the PyTorch flow's speculative-decoding perf section zeroed even when drafting ran
    (TensorRT-LLM PR #17082; tests/upstream/llm_api.json): the model then sends no acceptance outputs at all."""
    for server in _serve(tiny_pair, tmp_path, "zeroed"):
        with TritonLLMClient(server.grpc_url) as client:
            for stream in (False, True):
                r = client.generate(PROMPTS[0], MAX_TOKENS, stream=stream)
                assert r.text == hf_greedy(PROMPTS[0])
                assert not {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"} & set(r.stats)
                assert 0 < r.stats["num_output_tokens"] <= MAX_TOKENS
