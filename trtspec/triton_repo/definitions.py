"""The models of a draft-target repository, each as a ModelDefinition: its config protobuf and the files to copy.

``ensemble`` -> ``preprocessing`` -> ``tensorrt_llm_bls`` (draft-target orchestrator) -> ``postprocessing`` are the
same for every runtime. The two engine-backed models (``tensorrt_llm``, ``tensorrt_llm_draft``) come from
``engine_models(spec)``, one function per runtime: the torch runtime's are Python models implementing the TRT-LLM
backend's tensor contract; an engine runtime returns backend ``tensorrtllm`` definitions of the same two names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.build.layout import served_ngram_pool, served_roles, serving_model_dir
from trtspec.build.memory import TORCH_KV_SLOTS_PER_SEQUENCE
from trtspec.request_fields import SAMPLING_FIELDS, SPECULATION_FIELDS
from trtspec.spec import BuildSpec, Runtime
from trtspec.speculative.rules import MAX_DRAFT_LEN
from trtspec.triton_repo import tensors as t
from trtspec.triton_repo.names import (
    BLS,
    DRAFT,
    ENSEMBLE,
    LLMAPI,
    LLMAPI_SOURCE,
    POST,
    PRE,
    ROLE_MODELS,
    TARGET,
    TORCH_ENGINE_SOURCE,
    TORCH_SPEC_SOURCE,
)
from trtspec.triton_repo.pbtxt import Batching, new_config
from trtspec.trtllm.trtllm_build import engine_input_limits

MODELS_DIR = Path(__file__).parent / "models"
__all__ = ["BLS", "DRAFT", "ENSEMBLE", "POST", "PRE", "TARGET", "ModelDefinition", "repository_models"]
STREAM_CONTEXT_TOKENS = 32  # tokens of context the orchestrator sends with each streamed response (detokenization)


@dataclass
class ModelDefinition:
    """One model directory: ``config`` (a ModelConfig protobuf) and ``files`` (path in the model dir -> source)."""

    name: str
    config: Any
    files: dict[str, Path] = field(default_factory=dict)
    external_paths: list[Path] = field(default_factory=list)  # directories the model reads at load time
    # Where an external path appears inside the serving container, when not at the same path (engines: /engines/..).
    container_paths: dict[Path, str] = field(default_factory=dict)
    server_env: dict[str, str] = field(default_factory=dict)  # environment the server needs for this model
    texts: dict[str, str] = field(default_factory=dict)  # generated files: path in the model dir -> content
    # A tokenizer copied into the model (the writer copies its files into ``1/<TOKENIZER_DIR>``): its source directory.
    tokenizer_from: Path | None = None

    def __post_init__(self) -> None:
        if self.config.name != self.name:
            raise ValueError(f"definition {self.name!r} holds the config of {self.config.name!r}")


def _python_files(source_model: str) -> dict[str, Path]:
    return {"1/model.py": MODELS_DIR / source_model / "model.py"}


def tokenizer_source(spec: BuildSpec) -> Path:
    """Where the repository's tokenizer is copied from. The target's tokenizer is the pair's (check verifies the
    draft shares it): its serving directory, or for engines (which hold no tokenizer) the quantize stage's
    checkpoint, written with the tokenizer files."""
    if spec.runtime is Runtime.TRTLLM_ENGINE:
        from trtspec.build.layout import checkpoint_dir

        return checkpoint_dir(spec, "target")
    return serving_model_dir(spec, "target")


# preprocessing and postprocessing carry their own copy of the tokenizer, in their version directory, and name it
# relative to that directory: the repository itself is all they read, so every deployment form that mounts the
# repository (serve --docker, compose, Kubernetes) finds it, wherever the build wrote the checkpoints.
TOKENIZER_DIR = "tokenizer"


# -- runtime-independent models ------------------------------------------------------------------------------------
def preprocessing(spec: BuildSpec) -> ModelDefinition:
    mbs = spec.engine.max_batch_size
    c = new_config(
        PRE,
        backend="python",
        max_batch_size=mbs,
        instances=1,
        parameters={
            "tokenizer_dir": TOKENIZER_DIR,
            "add_special_tokens": True,
            "max_input_len": spec.engine.max_input_len,
            "max_seq_len": spec.engine.max_seq_len,
        },
        inputs=t.PRE_INPUTS,
        outputs=t.PRE_OUTPUTS,
        batching=Batching(spec.triton.max_queue_delay_us),
    )
    return ModelDefinition(PRE, c, _python_files(PRE), tokenizer_from=tokenizer_source(spec))


def postprocessing(spec: BuildSpec) -> ModelDefinition:
    c = new_config(
        POST,
        backend="python",
        max_batch_size=spec.engine.max_batch_size,
        instances=1,
        parameters={
            "tokenizer_dir": TOKENIZER_DIR,
            "skip_special_tokens": True,
        },
        inputs=t.POST_INPUTS,
        outputs=t.POST_OUTPUTS,
        batching=Batching(spec.triton.max_queue_delay_us),
    )
    return ModelDefinition(POST, c, _python_files(POST), tokenizer_from=tokenizer_source(spec))


def engine_capabilities(spec: BuildSpec) -> dict[str, Any]:
    """What the two engine-backed models can do, for the orchestrator to check requests against: the target's
    ``max_draft_len`` (TensorRT-LLM's ``LlmRequest::validate`` rejects more draft tokens), the longest input they take
    (``engine_input_limits``: a step re-sends the whole sequence) and whether both return generation logits (engines:
    built with ``--gather_generation_logits``, which draft logits need on both)."""
    if spec.runtime is Runtime.TORCH:  # the torch engines take any K up to trtspec's limit, and return logits
        return {
            "engine_max_draft_len": MAX_DRAFT_LEN,
            "engine_generation_logits": True,
            "engine_exact_penalties": True,
            "engine_max_input_len": spec.engine.max_seq_len - 1,
        }
    return {
        "engine_max_draft_len": spec.speculative.max_draft_len,
        "engine_generation_logits": spec.speculative.use_draft_logits,
        # TensorRT-LLM's penalty kernel (cpp/tensorrt_llm/kernels/penaltyKernels.cu) counts the tokens before a step
        # for every draft position in it, and masks end_id by the step's start: verified drafts would not be the
        # target's own penalized output, so the orchestrator refuses penalties and min_tokens over these engines.
        "engine_exact_penalties": False,
        "engine_max_input_len": engine_input_limits(spec).max_input_tokens,
    }


NGRAM_POOL_FILE = "ngram_pool.npz"  # in the orchestrator's version directory: served wherever the repository is


def _draft_target_parameters(spec: BuildSpec, pool: str) -> dict[str, Any]:
    """What both draft-target models (the orchestrator, the in-process model: names.DRAFT_TARGET_MODELS) tell their
    clients and read themselves: K, the route threshold, the drafter and its pool, the streaming settings."""
    sp = spec.speculative
    return {
        "max_draft_len": sp.max_draft_len,
        "max_input_len": spec.engine.max_input_len,  # a request's prompt, in tokens (as preprocessing counts them)
        "route_threshold": sp.route_threshold,
        "exclude_input_in_output": False,
        "stream_context_tokens": STREAM_CONTEXT_TOKENS,
        "drafter": sp.drafter.value,
        "ngram_pool": pool,
    }


def orchestrator(spec: BuildSpec) -> ModelDefinition:
    sp = spec.speculative
    files = _python_files(BLS)
    pool = ""  # the n-gram pool of the ngram and hybrid drafters, copied into the model (empty: prompt lookup only)
    served_pool = served_ngram_pool(spec)
    if served_pool is not None:
        files[f"1/{NGRAM_POOL_FILE}"] = served_pool
        pool = NGRAM_POOL_FILE
    c = new_config(
        BLS,
        backend="python",
        max_batch_size=spec.engine.max_batch_size,
        decoupled=spec.triton.decoupled,
        instances=spec.triton.orchestrator_instances,
        parameters={
            "tensorrt_llm_model_name": TARGET,
            "tensorrt_llm_draft_model_name": DRAFT,
            "use_draft_logits": sp.use_draft_logits,
            **engine_capabilities(spec),
            "max_seq_len": spec.engine.max_seq_len,
            **_draft_target_parameters(spec, pool),
        },
        inputs=t.BLS_INPUTS,
        outputs=t.BLS_OUTPUTS,
    )
    return ModelDefinition(BLS, c, files)


def _step(c: Any, model: str, inputs: dict[str, str], outputs: dict[str, str]) -> None:
    s = c.ensemble_scheduling.step.add(model_name=model, model_version=-1)
    for k, v in inputs.items():
        s.input_map[k] = v
    for k, v in outputs.items():
        s.output_map[k] = v


def ensemble(spec: BuildSpec) -> ModelDefinition:
    c = new_config(
        ENSEMBLE,
        platform="ensemble",
        max_batch_size=spec.engine.max_batch_size,
        inputs=t.ENSEMBLE_INPUTS,
        outputs=t.ENSEMBLE_OUTPUTS,
    )
    c.ensemble_scheduling.SetInParent()
    _step(
        c,
        PRE,
        {
            "QUERY": "text_input",
            "REQUEST_OUTPUT_LEN": "max_tokens",
            "BAD_WORDS_DICT": "bad_words",
            "STOP_WORDS_DICT": "stop_words",
            "END_ID": "end_id",
            "PAD_ID": "pad_id",
            "APPLY_CHAT_TEMPLATE": "apply_chat_template",
            **{i.name: i.name for i in t.UNSUPPORTED_ENSEMBLE_INPUTS},
        },
        {
            "INPUT_ID": "_INPUT_ID",
            "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
            "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
            "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
            "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
            "OUT_END_ID": "_PREPROCESSOR_END_ID",
            "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
        },
    )
    _step(
        c,
        TARGET if spec.in_process else BLS,
        {
            "input_ids": "_INPUT_ID",
            "input_lengths": "_REQUEST_INPUT_LEN",
            "request_output_len": "_REQUEST_OUTPUT_LEN",
            "end_id": "_PREPROCESSOR_END_ID",
            "pad_id": "_PREPROCESSOR_PAD_ID",
            "stop_words_list": "_STOP_WORDS_IDS",
            "bad_words_list": "_BAD_WORDS_IDS",
            **{f.engine: f.name for f in SAMPLING_FIELDS},  # trtspec.request_fields
            "exclude_input_in_output": "exclude_input_in_output",
            "return_perf_metrics": "return_perf_metrics",
            "streaming": "stream",
            **{f.engine: f.name for f in SPECULATION_FIELDS},
        },
        {
            "output_ids": "_TOKENS_BATCH",
            "sequence_length": "_SEQUENCE_LENGTH",
            "decoded_length": "_DECODED_LENGTH",
            "is_final": "_IS_FINAL",
            **{o.name: o.name for o in t.STAT_OUTPUTS},
        },
    )
    _step(
        c,
        POST,
        {
            "TOKENS_BATCH": "_TOKENS_BATCH",
            "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH",
            "DECODED_LENGTH": "_DECODED_LENGTH",
            "IS_FINAL": "_IS_FINAL",
        },
        {"OUTPUT": "text_output"},
    )
    return ModelDefinition(ENSEMBLE, c)  # the writer creates the empty version directory 1/


# -- the engine-backed pair, per runtime ----------------------------------------------------------------------------
def _torch_engine(spec: BuildSpec, role: str) -> ModelDefinition:
    name = ROLE_MODELS[role]
    model = getattr(spec, role)
    model_dir = serving_model_dir(spec, role)
    instances = spec.triton.target_instances if role == "target" else spec.triton.draft_instances
    mbs = spec.engine.max_batch_size
    # Decoupled always: the engine batches in flight on its own thread and answers through response senders.
    c = new_config(
        name,
        backend="python",
        max_batch_size=mbs,
        decoupled=True,
        instances=instances,
        parameters={
            "model_dir": model_dir,
            "dtype": model.dtype.value,
            "max_batch_size": mbs,
            "max_seq_len": spec.engine.max_seq_len,
            "kv_cache_slots": TORCH_KV_SLOTS_PER_SEQUENCE * mbs,
            "max_queue_delay_microseconds": spec.triton.max_queue_delay_us,
            "exclude_input_in_output": False,
            "role": role,
        },
        inputs=t.ENGINE_INPUTS,
        outputs=t.ENGINE_OUTPUTS,
        batching=Batching(spec.triton.max_queue_delay_us),
    )
    return ModelDefinition(name, c, _python_files(TORCH_ENGINE_SOURCE), [model_dir])


def torch_engine_models(spec: BuildSpec) -> list[ModelDefinition]:
    return [_torch_engine(spec, role) for role in served_roles(spec)]


def torch_in_process_model(spec: BuildSpec) -> ModelDefinition:
    """Runtime torch, orchestration in_process: ``tensorrt_llm`` holds the target and the draft in one process and
    runs the draft-target loop inside one in-flight engine (one packed draft pass per draft token and one target pass
    per step for all active requests; no per-step IPC). It takes the orchestrator's tensor contract, so the ensemble
    is upstream's shape: preprocessing -> tensorrt_llm -> postprocessing."""
    mbs = spec.engine.max_batch_size
    dirs = {role: serving_model_dir(spec, role) for role in ("target", "draft")}
    external = list(dirs.values())
    pool = ""  # the n-gram pool of the ngram and hybrid drafters (empty: prompt lookup only)
    served_pool = served_ngram_pool(spec)
    if served_pool is not None:
        pool = str(served_pool)
        if served_pool.parent not in external:
            external.append(served_pool.parent)
    c = new_config(
        TARGET,
        backend="python",
        max_batch_size=mbs,
        decoupled=spec.triton.decoupled,
        instances=spec.triton.target_instances,
        parameters={
            "model_dir": dirs["target"],
            "dtype": spec.target.dtype.value,
            "draft_model_dir": dirs["draft"],
            "draft_dtype": spec.draft.dtype.value,
            "max_batch_size": mbs,
            "max_seq_len": spec.engine.max_seq_len,
            "kv_cache_slots": TORCH_KV_SLOTS_PER_SEQUENCE * mbs,
            "max_queue_delay_microseconds": spec.triton.max_queue_delay_us,
            "engine_max_draft_len": MAX_DRAFT_LEN,
            **_draft_target_parameters(spec, pool),
        },
        inputs=t.BLS_INPUTS,
        outputs=t.BLS_OUTPUTS,
        batching=Batching(spec.triton.max_queue_delay_us),
    )
    return ModelDefinition(TARGET, c, _python_files(TORCH_SPEC_SOURCE), external)


def trtllm_engine_models(spec: BuildSpec) -> list[ModelDefinition]:
    """Backend ``tensorrtllm`` on the engines (trtspec.triton_repo.engine_definitions), decoupled so that the
    orchestrator can stream routed requests. The engines are read at their container paths (/engines/<role>)."""
    from trtspec.build.layout import engine_dir
    from trtspec.triton_repo.engine_definitions import SERVER_ENV, engine_model_configs
    from trtspec.trtllm.container import engine_path_in_container

    configs = engine_model_configs(spec, decoupled=True)
    out = []
    for role in served_roles(spec):
        name = ROLE_MODELS[role]
        path = engine_dir(spec, role)
        out.append(
            ModelDefinition(
                name,
                configs[name],
                external_paths=[path],
                container_paths={path: engine_path_in_container(role)},
                server_env=SERVER_ENV,
            )
        )
    return out


def llmapi_models(spec: BuildSpec) -> list[ModelDefinition]:
    """Runtime trtllm-llmapi: one Python model, ``tensorrt_llm``, running TensorRT-LLM's LLM API with draft-target
    speculative decoding configured in ``1/model.yaml`` (trtspec.trtllm.llmapi). The LLM API runs the draft-target
    loop and in-flight batching itself, so there is no separate draft model, orchestrator or ensemble; the tensor
    contract is that of TensorRT-LLM's own llmapi model (text in, text out)."""
    from trtspec.trtllm.container import checkpoint_path_in_container
    from trtspec.trtllm.llmapi import model_yaml, model_yaml_text

    triton = model_yaml(spec)["triton_config"]
    c = new_config(
        LLMAPI,
        backend="python",
        max_batch_size=triton["max_batch_size"],
        decoupled=triton["decoupled"],
        instances=1,
        parameters={"llm_config": "model.yaml"},
        inputs=t.LLMAPI_INPUTS,
        outputs=t.LLMAPI_OUTPUTS,
    )
    dirs = {role: serving_model_dir(spec, role) for role in ("target", "draft")}
    return [
        ModelDefinition(
            LLMAPI,
            c,
            _python_files(LLMAPI_SOURCE),
            external_paths=list(dirs.values()),
            texts={"1/model.yaml": model_yaml_text(spec)},
            container_paths={d: checkpoint_path_in_container(r) for r, d in dirs.items()},
        )
    ]


ENGINE_MODELS: dict[Runtime, Callable[[BuildSpec], list[ModelDefinition]]] = {
    Runtime.TORCH: torch_engine_models,
    Runtime.TRTLLM_ENGINE: trtllm_engine_models,
    Runtime.TRTLLM_LLMAPI: llmapi_models,
}


def engine_models(spec: BuildSpec) -> list[ModelDefinition]:
    """``tensorrt_llm`` and ``tensorrt_llm_draft`` for the spec's runtime; no draft model where the draft does not
    run (drafter ngram: ``build.layout.runs``)."""
    return ENGINE_MODELS[spec.runtime](spec)


def repository_models(spec: BuildSpec) -> list[ModelDefinition]:
    """Every model of the repository, in dependency order."""
    if spec.runtime is Runtime.TRTLLM_LLMAPI:
        return engine_models(spec)  # the LLM API model alone (see llmapi_models)
    if spec.in_process:
        return [preprocessing(spec), torch_in_process_model(spec), postprocessing(spec), ensemble(spec)]
    return [preprocessing(spec), *engine_models(spec), orchestrator(spec), postprocessing(spec), ensemble(spec)]
