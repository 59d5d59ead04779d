"""Tensor names, types and dims of every model in the repository.

Mirrors TensorRT-LLM's ``triton_backend/all_models/inflight_batcher_llm/{ensemble,preprocessing,postprocessing,
tensorrt_llm,tensorrt_llm_bls}/config.pbtxt`` (same names, types and dims) for the fields trtspec implements. The
ensemble declares every input of upstream's, and those trtspec does not implement (beam search, LoRA,
prompt tuning ...: ``UNSUPPORTED_ENSEMBLE_INPUTS``) go to preprocessing, which refuses a value other than upstream's
default by name (trtspec.validation.UNSUPPORTED_INPUTS) instead of ignoring it. Additions are marked "trtspec". The
exception is backend tensorrtllm (runtime trtllm-engine), which implements all of its template's tensors. One format:
``TensorSpec`` rows, which ``pbtxt.new_config`` turns into a model's inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from trtspec.request_fields import SAMPLING_FIELDS, SPECULATION_FIELDS
from trtspec.triton_repo.pbtxt import TensorSpec as T

SCALAR = (1,)
NO_SHAPE = ()  # TRT-LLM's `reshape: { shape: [ ] }`
# Data types filled per model (``with_dtypes``), as upstream's template leaves them: ${encoder_input_features_data_type}
# and ${prompt_embedding_table_data_type} (the model's dtype), ${logits_datatype}.
MODEL_DTYPE, LOGITS_DTYPE = "${dtype}", "${logits}"


def with_dtypes(specs: Iterable[T], model_dtype: str, logits_dtype: str) -> list[T]:
    """``specs`` with MODEL_DTYPE and LOGITS_DTYPE replaced by Triton types (``FP16`` ...)."""
    fill = {MODEL_DTYPE: model_dtype, LOGITS_DTYPE: logits_dtype}
    return [replace(s, dtype=fill.get(s.dtype, s.dtype)) for s in specs]


# -- ensemble (what clients see) -----------------------------------------------------------------------------------
# text_input and max_tokens are required, but declared optional (trtspec; upstream declares them required): Triton
# 2.51 admits a request that lacks a required input whenever its input count is within range, and the ensemble then
# never runs the step that needs the input: a stream gets an empty final response (or nothing), HTTP generate_stream
# an empty 200. Declared optional, the request reaches preprocessing, which answers it with an error on every protocol.
REQUIRED_ENSEMBLE_INPUTS = ("text_input", "max_tokens")
ENSEMBLE_INPUTS = [
    T("text_input", "STRING", SCALAR, optional=True),
    T("max_tokens", "INT32", SCALAR, optional=True),
    T("bad_words", "STRING", (-1,), optional=True),
    T("stop_words", "STRING", (-1,), optional=True),
    T("exclude_input_in_output", "BOOL", SCALAR, optional=True),
    T("end_id", "INT32", SCALAR, optional=True),
    T("pad_id", "INT32", SCALAR, optional=True),
    *(T(f.name, f.dtype, SCALAR, optional=True) for f in SAMPLING_FIELDS),  # trtspec.request_fields
    T("return_perf_metrics", "BOOL", SCALAR, optional=True),
    T("stream", "BOOL", SCALAR, optional=True),
    *(T(f.name, f.dtype, SCALAR, optional=True) for f in SPECULATION_FIELDS),  # upstream: tensorrt_llm_bls inputs
    T("apply_chat_template", "BOOL", SCALAR, optional=True),  # trtspec: wrap text_input in the chat template
]
# Upstream's ensemble inputs that trtspec does not implement (every one in trtspec.validation.UNSUPPORTED_INPUTS) or
# honours without a model input (ALWAYS_HONOURED_INPUTS): the ensemble passes each to preprocessing under its own name.
UNSUPPORTED_ENSEMBLE_INPUTS = [
    T("decoder_text_input", "STRING", SCALAR, optional=True),
    T("num_return_sequences", "INT32", SCALAR, optional=True),
    T("length_penalty", "FP32", SCALAR, optional=True),
    T("return_log_probs", "BOOL", SCALAR, optional=True),
    T("return_context_logits", "BOOL", SCALAR, optional=True),
    T("return_generation_logits", "BOOL", SCALAR, optional=True),
    T("return_num_input_tokens", "BOOL", SCALAR, optional=True),  # honoured: num_input_tokens is always returned
    T("return_num_output_tokens", "BOOL", SCALAR, optional=True),  # honoured: num_output_tokens is always returned
    T("beam_width", "INT32", SCALAR, optional=True),
    T("prompt_embedding_table", "FP16", (-1, -1), optional=True),
    T("prompt_table_extra_id", "UINT64", SCALAR, optional=True),
    T("prompt_vocab_size", "INT32", SCALAR, optional=True),
    T("embedding_bias_words", "STRING", (-1,), optional=True),
    T("embedding_bias_weights", "FP32", (-1,), optional=True),
    T("lora_task_id", "UINT64", SCALAR, optional=True),
    T("lora_weights", "FP16", (-1, -1), optional=True, ragged=True),
    T("lora_config", "INT32", (-1, 3), optional=True, ragged=True),
    T("guided_decoding_guide_type", "STRING", SCALAR, optional=True, ragged=True),
    T("guided_decoding_guide", "STRING", SCALAR, optional=True, ragged=True),
]
ENSEMBLE_INPUTS += UNSUPPORTED_ENSEMBLE_INPUTS
STAT_OUTPUTS = [
    T("acceptance_rate", "FP32", SCALAR),
    T("total_accepted_draft_tokens", "INT32", SCALAR),
    T("total_draft_tokens", "INT32", SCALAR),
    T("num_input_tokens", "INT32", SCALAR),
    T("num_output_tokens", "INT32", SCALAR),
    T("arrival_time_ns", "INT64", SCALAR),
    T("first_token_time_ns", "INT64", SCALAR),
    T("last_token_time_ns", "INT64", SCALAR),
]
ENSEMBLE_OUTPUTS = [T("text_output", "STRING", (-1,)), *STAT_OUTPUTS]

# -- preprocessing -------------------------------------------------------------------------------------------------
PRE_INPUTS = [
    T("QUERY", "STRING", SCALAR, optional=True),  # required: see REQUIRED_ENSEMBLE_INPUTS
    T("REQUEST_OUTPUT_LEN", "INT32", SCALAR, optional=True),
    T("BAD_WORDS_DICT", "STRING", (-1,), optional=True),
    T("STOP_WORDS_DICT", "STRING", (-1,), optional=True),
    T("END_ID", "INT32", SCALAR, optional=True),
    T("PAD_ID", "INT32", SCALAR, optional=True),
    T("APPLY_CHAT_TEMPLATE", "BOOL", SCALAR, optional=True),  # trtspec
    *UNSUPPORTED_ENSEMBLE_INPUTS,  # trtspec: refused unless absent or upstream's default
]
PRE_OUTPUTS = [
    T("INPUT_ID", "INT32", (-1,)),
    T("REQUEST_INPUT_LEN", "INT32", SCALAR),
    T("BAD_WORDS_IDS", "INT32", (2, -1)),
    T("STOP_WORDS_IDS", "INT32", (2, -1)),
    T("REQUEST_OUTPUT_LEN", "INT32", (-1,)),
    T("OUT_END_ID", "INT32", SCALAR),
    T("OUT_PAD_ID", "INT32", SCALAR),
]

# -- postprocessing ------------------------------------------------------------------------------------------------
POST_INPUTS = [
    T("TOKENS_BATCH", "INT32", (-1, -1)),
    T("SEQUENCE_LENGTH", "INT32", (-1,)),
    T("DECODED_LENGTH", "INT32", (-1,), optional=True),  # trtspec: tokens whose text earlier responses carried
    T("IS_FINAL", "BOOL", (-1,), optional=True),  # trtspec: last response: flush an incomplete character
]
POST_OUTPUTS = [T("OUTPUT", "STRING", (-1,))]

# -- tensorrt_llm / tensorrt_llm_draft for runtime trtllm-engine (backend tensorrtllm) ------------------------------
# The whole contract of upstream's inflight_batcher_llm/tensorrt_llm/config.pbtxt (tests/upstream/: the template).
BACKEND_INPUTS = [
    T("input_ids", "INT32", (-1,), optional=True, ragged=True),
    T("encoder_input_features", MODEL_DTYPE, (-1, -1), optional=True, ragged=True),
    T("encoder_output_lengths", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("input_lengths", "INT32", SCALAR, reshape=NO_SHAPE),
    T("request_output_len", "INT32", SCALAR, reshape=NO_SHAPE),
    T("num_return_sequences", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("draft_input_ids", "INT32", (-1,), optional=True, ragged=True),
    T("decoder_input_ids", "INT32", (-1,), optional=True, ragged=True),
    T("decoder_input_lengths", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("draft_logits", LOGITS_DTYPE, (-1, -1), optional=True, ragged=True),
    T("draft_acceptance_threshold", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("end_id", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("pad_id", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("stop_words_list", "INT32", (2, -1), optional=True, ragged=True),
    T("bad_words_list", "INT32", (2, -1), optional=True, ragged=True),
    T("embedding_bias", "FP32", (-1,), optional=True, ragged=True),
    T("beam_width", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("temperature", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("runtime_top_k", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("runtime_top_p", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("runtime_top_p_min", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("runtime_top_p_decay", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("runtime_top_p_reset_ids", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("len_penalty", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("early_stopping", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("repetition_penalty", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("min_tokens", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("beam_search_diversity_rate", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("presence_penalty", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("frequency_penalty", "FP32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("seed", "UINT64", SCALAR, optional=True, reshape=NO_SHAPE),
    T("return_log_probs", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("return_context_logits", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("return_generation_logits", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("return_perf_metrics", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("return_num_input_tokens", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("return_num_output_tokens", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("exclude_input_in_output", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("stop", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("streaming", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("prompt_embedding_table", MODEL_DTYPE, (-1, -1), optional=True, ragged=True),
    T("prompt_table_extra_ids", "UINT64", (-1,), optional=True, ragged=True),
    T("prompt_vocab_size", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("lora_task_id", "UINT64", SCALAR, optional=True, reshape=NO_SHAPE),
    T("lora_weights", "FP16", (-1, -1), optional=True, ragged=True),
    T("lora_config", "INT32", (-1, 3), optional=True, ragged=True),
]
BACKEND_OUTPUTS = [
    T("output_ids", "INT32", (-1, -1)),
    T("sequence_length", "INT32", (-1,)),
    T("cum_log_probs", "FP32", (-1,)),
    T("output_log_probs", "FP32", (-1, -1)),
    T("context_logits", LOGITS_DTYPE, (-1, -1)),
    T("generation_logits", LOGITS_DTYPE, (-1, -1, -1)),
    T("batch_index", "INT32", SCALAR),
    T("sequence_index", "INT32", SCALAR),
    T("context_phase_params", "UINT8", (-1,)),
    # Written into every response of a request with return_perf_metrics, asked for or not: undeclared, Triton fails the
    # response ("unexpected inference output").
    T("kv_cache_alloc_new_blocks", "INT32", SCALAR),
    T("kv_cache_reused_blocks", "INT32", SCALAR),
    T("kv_cache_alloc_total_blocks", "INT32", SCALAR),
    T("arrival_time_ns", "INT64", SCALAR),
    T("first_scheduled_time_ns", "INT64", SCALAR),
    T("first_token_time_ns", "INT64", SCALAR),
    T("last_token_time_ns", "INT64", SCALAR),
    T("acceptance_rate", "FP32", SCALAR),
    T("total_accepted_draft_tokens", "INT32", SCALAR),
    T("total_draft_tokens", "INT32", SCALAR),
    # return_num_input_tokens / return_num_output_tokens
    T("num_input_tokens", "INT32", SCALAR),
    T("num_output_tokens", "INT32", SCALAR),
]

# -- tensorrt_llm / tensorrt_llm_draft for runtime torch (the subset of the backend contract that it implements) ----
ENGINE_INPUTS = [
    T("input_ids", "INT32", (-1,), optional=True, ragged=True),
    T("input_lengths", "INT32", SCALAR, reshape=NO_SHAPE),
    T("request_output_len", "INT32", SCALAR, reshape=NO_SHAPE),
    T("draft_input_ids", "INT32", (-1,), optional=True, ragged=True),
    T("draft_logits", "FP32", (-1, -1), optional=True, ragged=True),
    T("end_id", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("pad_id", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    T("stop_words_list", "INT32", (2, -1), optional=True, ragged=True),
    T("bad_words_list", "INT32", (2, -1), optional=True, ragged=True),
    T("beam_width", "INT32", SCALAR, optional=True, reshape=NO_SHAPE),
    *(T(f.engine, f.dtype, SCALAR, optional=True, reshape=NO_SHAPE) for f in SAMPLING_FIELDS),
    T("return_generation_logits", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("exclude_input_in_output", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
    T("streaming", "BOOL", SCALAR, optional=True, reshape=NO_SHAPE),
]
ENGINE_OUTPUTS = [
    T("output_ids", "INT32", (-1, -1)),
    T("sequence_length", "INT32", (-1,)),
    T("generation_logits", "FP32", (-1, -1, -1)),
    T("batch_index", "INT32", SCALAR),
]

# -- tensorrt_llm_bls (the draft-target orchestrator; token level, between pre- and postprocessing) ------------------
BLS_INPUTS = [
    T("input_ids", "INT32", (-1,)),
    T("input_lengths", "INT32", SCALAR),
    T("request_output_len", "INT32", (-1,)),
    T("end_id", "INT32", SCALAR, optional=True),
    T("pad_id", "INT32", SCALAR, optional=True),
    T("stop_words_list", "INT32", (2, -1), optional=True),
    T("bad_words_list", "INT32", (2, -1), optional=True),
    *(T(f.engine, f.dtype, SCALAR, optional=True) for f in SAMPLING_FIELDS),
    T("exclude_input_in_output", "BOOL", SCALAR, optional=True),
    T("return_perf_metrics", "BOOL", SCALAR, optional=True),
    T("streaming", "BOOL", SCALAR, optional=True),
    *(T(f.engine, f.dtype, SCALAR, optional=True) for f in SPECULATION_FIELDS),
    T("return_log_probs", "BOOL", SCALAR, optional=True),  # honoured by the in-process model; BLS refuses true
    T("top_logprobs", "INT32", SCALAR, optional=True),  # trtspec: alternatives per token with return_log_probs
]
BLS_OUTPUTS = [
    T("output_ids", "INT32", (-1, -1)),
    T("sequence_length", "INT32", (-1,)),
    T("decoded_length", "INT32", (-1,)),  # trtspec: see postprocessing DECODED_LENGTH
    T("is_final", "BOOL", (-1,)),  # trtspec
    *STAT_OUTPUTS,
    # With return_log_probs: per token of output_ids (streamed: the context tokens too) its log-probability under
    # the target [B, 1, L], and their sum over the generated tokens [B, 1] (upstream's names and dims)
    T("output_log_probs", "FP32", (-1, -1)),
    T("cum_log_probs", "FP32", (-1,)),
    # trtspec, with top_logprobs N > 0: the N most likely tokens at each position and their log-probabilities [B, L, N]
    T("output_top_ids", "INT32", (-1, -1)),
    T("output_top_log_probs", "FP32", (-1, -1)),
]

# -- tensorrt_llm for runtime trtllm-llmapi (TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm) ----------
# max_batch_size 0 there (the LLM API batches in flight itself), so these dims are the full shapes. The subset of the
# upstream contract that trtspec's model.py implements (LoRA, multimodal and penalties are left out), plus two
# trtspec additions marked below.
LLMAPI_INPUTS = [
    T("text_input", "STRING", (-1,)),
    T("streaming", "BOOL", SCALAR, optional=True),
    *(T(f.llmapi, f.dtype, SCALAR, optional=True) for f in SAMPLING_FIELDS if f.llmapi),
    T("sampling_param_max_tokens", "INT32", SCALAR, optional=True),
    T("sampling_param_stop", "STRING", (-1,), optional=True),
    T("sampling_param_exclude_input_from_output", "BOOL", SCALAR, optional=True),
    T("sampling_param_return_perf_metrics", "BOOL", SCALAR, optional=True),
    T("apply_chat_template", "BOOL", SCALAR, optional=True),  # trtspec: the target tokenizer's chat template
]
LLMAPI_OUTPUTS = [
    T("text_output", "STRING", (-1,)),
    T("finish_reason", "STRING", (-1,)),
    T("acceptance_rate", "FP32", SCALAR),
    T("total_accepted_draft_tokens", "INT32", SCALAR),
    T("total_draft_tokens", "INT32", SCALAR),
    T("num_output_tokens", "INT32", SCALAR),  # trtspec: tokens generated so far
]
