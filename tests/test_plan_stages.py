"""`trtspec plan` describes the stage list `trtspec build` runs (``pipeline_stages``): the same stages, outputs and
not-needed stages for every runtime, with and without quantization, and the repository's real model list."""

from __future__ import annotations

import pytest

from tests.engine_helpers import engine_spec
from trtspec.build.layout import NO_DRAFT_MODEL, ROLES, checkpoint_dir, engine_dir
from trtspec.pipeline import pipeline_stages
from trtspec.plan import build_plan
from trtspec.triton_repo.definitions import repository_models

RUNTIMES = ["torch", "trtllm-engine", "trtllm-llmapi"]


def _spec(tmp_path, tiny_pair, runtime: str, quantization: str):
    q = {"quantization": quantization}
    if runtime == "torch" and quantization == "none":
        q["dtype"] = "float32"
    return engine_spec(tmp_path, tiny_pair, runtime=runtime, target=q, draft=dict(q))


@pytest.mark.parametrize("quantization", ["fp8", "none"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_plan_and_pipeline_agree(tmp_path, tiny_pair, runtime, quantization):
    spec = _spec(tmp_path, tiny_pair, runtime, quantization)
    stages = pipeline_stages(spec)
    plan = build_plan(spec)
    # build_plan walks pipeline_stages, so names and outputs agree by construction; what each stage's own
    # description says (its action) is what can disagree, and the layout rules below what can be wrong.
    assert plan[-1].name == "serve"
    planned = {s.name: s for s in plan}
    for stage in stages:
        assert planned[stage.name].action.startswith("none:") is (stage.not_needed is not None), stage.name
    not_needed = {s.name for s in stages if s.not_needed is not None}
    assert {s.name for s in plan if s.action.startswith("none:")} == not_needed
    # what each runtime needs, as the layout rules say
    engines = runtime == "trtllm-engine"
    quantized = quantization != "none"
    for role in ROLES:
        assert (f"quantize:{role}" in not_needed) is not (engines or quantized)
        assert (f"compile:{role}" in not_needed) is not engines
        if f"quantize:{role}" not in not_needed:
            assert planned[f"quantize:{role}"].outputs == [str(checkpoint_dir(spec, role))]
        if engines:
            assert planned[f"compile:{role}"].outputs == [str(engine_dir(spec, role))]
            assert planned[f"compile:{role}"].commands[0][0] == "trtllm-build"
    assert ("quality" in not_needed) is not (engines or quantized)
    models = [m.name for m in repository_models(spec)]
    assert planned["repo"].action.endswith(": " + ", ".join(models))
    assert planned["repo"].outputs == [str(spec.repo_dir)]
    if runtime == "trtllm-llmapi":
        assert models == ["tensorrt_llm"]  # the LLM API model alone


@pytest.mark.parametrize(
    ("runtime", "orchestration"), [("torch", "bls"), ("torch", "in_process"), ("trtllm-engine", None)]
)
def test_drafter_ngram_builds_and_serves_no_draft_model(tmp_path, tiny_pair, runtime, orchestration):
    """The n-gram drafter proposes from prompt lookup and the pool: no draft checkpoint, engine or engine model."""
    triton = {"orchestration": orchestration} if orchestration else {}
    spec = engine_spec(tmp_path, tiny_pair, runtime=runtime, speculative={"drafter": "ngram"}, triton=triton)
    model = engine_spec(tmp_path, tiny_pair, runtime=runtime, triton=triton)  # the same with the draft model
    stages = {s.name: s for s in pipeline_stages(spec)}
    assert stages["quantize:draft"].not_needed == stages["compile:draft"].not_needed == NO_DRAFT_MODEL
    assert stages["quantize:target"].not_needed is None and {s.name for s in pipeline_stages(model)} == set(stages)
    assert all(s.not_needed != NO_DRAFT_MODEL for s in pipeline_stages(model))
    names = [m.name for m in repository_models(spec)]
    with_model = [m.name for m in repository_models(model)]
    assert "tensorrt_llm_draft" not in names
    assert names == [n for n in with_model if n != "tensorrt_llm_draft"]
    if runtime == "trtllm-engine":  # the launch loads what the repository holds
        from trtspec.serving.launch import launch_settings

        assert launch_settings(spec)["engine_models"] == ["tensorrt_llm"]
        assert launch_settings(model)["engine_models"] == ["tensorrt_llm", "tensorrt_llm_draft"]
    planned = {s.name: s for s in build_plan(spec)}
    assert planned["quantize:draft"].action == f"none: {NO_DRAFT_MODEL}" and planned["quantize:draft"].outputs == []
