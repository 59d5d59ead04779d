"""The TensorRT-LLM backend's tensor contract, on numpy arrays: request inputs -> job settings, tokens -> outputs.

Names, dtypes and shapes follow ``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`` of
TensorRT-LLM: ``input_ids`` INT32 [B, L] with ``input_lengths``, ``request_output_len``, optional ``draft_input_ids``
INT32 [B, K] / ``draft_logits`` [B, K, V], ``end_id``, ``pad_id``, ``streaming``, ``runtime_top_k``,
``runtime_top_p``, ``temperature``, ``seed``, ``stop_words_list`` / ``bad_words_list`` INT32 [B, 2, L] (flat ids and
end offsets, -1 padded), ``return_generation_logits``, ``exclude_input_in_output``; outputs ``output_ids`` INT32
[B, beam=1, L], ``sequence_length`` INT32 [B, 1], ``generation_logits`` FP32 [B, 1, L, V].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtspec.errors import GenerationError
from trtspec.request_fields import SAMPLING_FIELDS, RequestField, engine_tensors
from trtspec.speculative.rules import SamplingParams, validate_sampling
from trtspec.validation import validate_top_logprobs


def _rows(x: np.ndarray | None, batch: int) -> list[Any] | None:
    """Per-row scalar values of an optional [B], [B, 1] (or [1]) tensor."""
    if x is None:
        return None
    flat = np.asarray(x).reshape(np.asarray(x).shape[0] if np.asarray(x).ndim else 1, -1)[:, 0]
    if len(flat) == 1 and batch > 1:
        flat = np.repeat(flat, batch)
    if len(flat) != batch:
        raise GenerationError(
            f"a per-request input has {len(flat)} rows for a batch of {batch}", hint="send one value per row"
        )
    return flat.tolist()


def decode_word_list(x: np.ndarray | None) -> list[list[int]]:
    """[2, L] (ids, end offsets padded with -1) -> list of token sequences."""
    if x is None:
        return []
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] != 2:
        raise GenerationError(
            f"word lists have shape [2, L], got {list(x.shape)}",
            hint="row 0: concatenated token ids, row 1: end offsets padded with -1",
        )
    ids, ends = x[0].tolist(), [int(e) for e in x[1].tolist() if e >= 0]
    words, start = [], 0
    for end in ends:
        if end <= start:
            continue
        words.append(ids[start:end])
        start = end
    return words


def encode_word_list(words: list[list[int]]) -> np.ndarray:
    """list of token sequences -> [2, L] INT32 (the preprocessing side of ``decode_word_list``)."""
    flat: list[int] = []
    ends: list[int] = []
    for w in words:
        flat.extend(w)
        ends.append(len(flat))
    n = max(len(flat), 1)
    out = np.zeros((2, n), dtype=np.int32)
    out[1, :] = -1
    out[0, : len(flat)] = flat
    out[1, : len(ends)] = ends
    return out


@dataclass
class RowRequest:
    """One row of a request, in engine terms (the orchestrator's request type too)."""

    tokens: list[int]
    max_new: int
    end_id: int | None = None
    pad_id: int = 0
    draft: list[int] | None = None
    draft_logits: np.ndarray | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stream: bool = False
    return_logits: bool = False
    exclude_input: bool = False
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    num_draft_tokens: int | None = None  # draft-target models: None means the deployment's max_draft_len
    use_draft_logits: bool | None = None  # draft-target models: None means the deployment's setting
    return_log_probs: bool = False  # each generated token's log-probability under the target
    top_logprobs: int = 0  # and this many most likely alternatives per position (trtspec)

    @property
    def logprobs(self) -> int | None:
        """What the engine job asks for (trtspec.runtimes.inflight.jobs.Job.logprobs)."""
        return self.top_logprobs if self.return_log_probs else None


def _typed(f: RequestField, value: Any) -> Any:
    """One row's value of a sampling field as Python's int or float (None stays None)."""
    if value is None:
        return None
    return float(value) if f.dtype.startswith("FP") else int(value)


def parse_request(
    inputs: Mapping[str, np.ndarray], *, exclude_input_default: bool = False, client_request: bool = False
) -> list[RowRequest]:
    """Validate one Triton request's inputs and split it into rows.

    ``client_request``: the request comes from a client (the draft-target models, behind the ensemble or called
    directly), so its sampling values pass trtspec's request rule (trtspec.speculative.rules.validate_sampling, as
    the CLI and the OpenAI API apply it) before TensorRT-LLM's reading of them (top_k 1 is greedy). Engine models
    take TensorRT-LLM's contract as it is (upstream's greedy sends top_p 0)."""
    if "input_ids" not in inputs:
        raise GenerationError("input_ids is required", hint="send input_ids INT32 [batch, tokens]")
    ids = np.asarray(inputs["input_ids"])
    if ids.ndim == 1:
        ids = ids[None]
    batch = ids.shape[0]
    lengths = _rows(inputs.get("input_lengths"), batch) or [ids.shape[1]] * batch
    out_len = _rows(inputs.get("request_output_len"), batch)
    if out_len is None:
        raise GenerationError("request_output_len is required", hint="send request_output_len INT32 [batch, 1]")
    beam = _rows(inputs.get("beam_width"), batch)
    if beam is not None and any(int(b) != 1 for b in beam):
        raise GenerationError("beam_width > 1 is not supported", hint="draft-target decoding uses beam width 1")

    def per_row(name: str, default: Any) -> list[Any]:
        v = _rows(inputs.get(name), batch)
        return v if v is not None else [default] * batch

    end_id = per_row("end_id", None)
    pad_id = per_row("pad_id", 0)
    stream = per_row("streaming", False)
    # The sampling fields (trtspec.request_fields), by field name: [value per row]
    sampling_rows = {f.name: per_row(f.engine, f.default) for f in SAMPLING_FIELDS}
    want_logits = per_row("return_generation_logits", False)
    exclude = per_row("exclude_input_in_output", exclude_input_default)
    k = per_row("num_draft_tokens", None)
    use_logits = per_row("use_draft_logits", None)
    want_logprobs = per_row("return_log_probs", False)
    top_logprobs = per_row("top_logprobs", 0)
    draft_ids = inputs.get("draft_input_ids")
    draft_logits = inputs.get("draft_logits")
    stop = inputs.get("stop_words_list")
    bad = inputs.get("bad_words_list")
    rows = []
    for b in range(batch):
        n = int(lengths[b])
        if not 0 < n <= ids.shape[1]:
            raise GenerationError(
                f"input_lengths[{b}] = {n} does not fit input_ids of width {ids.shape[1]}",
                hint="input_lengths counts the real tokens of each row",
            )
        draft = None
        if draft_ids is not None:
            d = np.asarray(draft_ids)
            draft = [int(t) for t in (d[b] if d.ndim == 2 else d).tolist()]
        dl = None
        if draft_logits is not None and draft is not None:
            arr = np.asarray(draft_logits)
            dl = arr[b] if arr.ndim == 3 else arr
        validate_top_logprobs(int(top_logprobs[b]), bool(want_logprobs[b]))
        values = {f.name: _typed(f, rows[b]) for f, rows in zip(SAMPLING_FIELDS, sampling_rows.values())}
        if client_request:
            validate_sampling(**values)
        # TRT-LLM samples with top_k = 1 / temperature unset by default: both "greedy" spellings are alike.
        sampling = SamplingParams.from_request(**values)
        rows.append(
            RowRequest(
                tokens=[int(t) for t in ids[b, :n].tolist()],
                max_new=int(out_len[b]),
                end_id=None if end_id[b] is None or int(end_id[b]) < 0 else int(end_id[b]),
                pad_id=int(pad_id[b]),
                draft=draft,
                draft_logits=dl,
                sampling=sampling,
                stream=bool(stream[b]),
                return_logits=bool(want_logits[b]),
                exclude_input=bool(exclude[b]),
                stop_words=decode_word_list(np.asarray(stop)[b]) if stop is not None else [],
                bad_words=decode_word_list(np.asarray(bad)[b]) if bad is not None else [],
                num_draft_tokens=None if k[b] is None else int(k[b]),
                use_draft_logits=None if use_logits[b] is None else bool(use_logits[b]),
                return_log_probs=bool(want_logprobs[b]),
                top_logprobs=int(top_logprobs[b]),
            )
        )
    return rows


# Greedy as upstream's own client sends it (tensorrtllm_backend inflight_batcher_llm_client.py: --top-k 1, --top-p 0,
# --temperature 1.0; tests/upstream/engine_sampling.json). TensorRT-LLM's sampling does not read temperature 0 as
# greedy: top_k 0 with top_p 1.0 samples the whole distribution, so trtspec's greedy (temperature 0) must not reach an
# engine as such. parse_request reads these back as greedy (top_k 1).
GREEDY_TEMPERATURE, GREEDY_TOP_K, GREEDY_TOP_P = 1.0, 1, 0.0


def _sampling_inputs(s: SamplingParams) -> dict[str, np.ndarray]:
    """The engine's sampling tensors: upstream's greedy for a greedy request, else temperature, top_k, top_p."""
    if s.greedy:
        t, k, p = GREEDY_TEMPERATURE, GREEDY_TOP_K, GREEDY_TOP_P
    else:
        t, k, p = s.temperature, s.top_k, s.top_p
    return {
        "temperature": np.asarray([[t]], dtype=np.float32),
        "runtime_top_k": np.asarray([[k]], dtype=np.int32),
        "runtime_top_p": np.asarray([[p]], dtype=np.float32),
    }


def engine_inputs(row: RowRequest) -> dict[str, np.ndarray]:
    """The engine model's input tensors (batch 1) for one row: what ``parse_request`` reads back."""
    s = row.sampling
    x = {
        "input_ids": np.asarray([row.tokens], dtype=np.int32),
        "input_lengths": np.asarray([[len(row.tokens)]], dtype=np.int32),
        "request_output_len": np.asarray([[row.max_new]], dtype=np.int32),
        "streaming": np.asarray([[row.stream]], dtype=np.bool_),
        "exclude_input_in_output": np.asarray([[row.exclude_input]], dtype=np.bool_),
        "pad_id": np.asarray([[row.pad_id]], dtype=np.int32),
        **_sampling_inputs(s),
        "return_generation_logits": np.asarray([[row.return_logits]], dtype=np.bool_),
    }
    if row.end_id is not None:
        x["end_id"] = np.asarray([[row.end_id]], dtype=np.int32)
    if s.seed is not None:
        x["seed"] = np.asarray([[s.seed]], dtype=np.uint64)
    # The other sampling fields where they are not their defaults (trtspec.request_fields)
    changed = {f.name: getattr(s, f.name) for f in SAMPLING_FIELDS if f.history and getattr(s, f.name) != f.default}
    x.update({name: arr for name, (arr, _) in engine_tensors(changed).items()})
    if row.stop_words:
        x["stop_words_list"] = encode_word_list([list(w) for w in row.stop_words])[None]
    if row.bad_words:
        x["bad_words_list"] = encode_word_list([list(w) for w in row.bad_words])[None]
    if row.draft:
        x["draft_input_ids"] = np.asarray([row.draft], dtype=np.int32)
        if row.draft_logits is not None:
            x["draft_logits"] = np.asarray(row.draft_logits, dtype=np.float32)[None]
    return x


def format_output(
    tokens: list[int],
    *,
    prompt: list[int] | None = None,
    logits: np.ndarray | None = None,
    batch_index: int | None = None,
) -> dict[str, np.ndarray]:
    """Output tensors for one row (batch dimension 1): ``prompt`` is prepended when the input is not excluded."""
    seq = (list(prompt) if prompt else []) + list(tokens)
    out: dict[str, np.ndarray] = {
        "output_ids": np.asarray(seq, dtype=np.int32).reshape(1, 1, len(seq)),
        "sequence_length": np.asarray([[len(seq)]], dtype=np.int32),
    }
    if logits is not None:
        out["generation_logits"] = np.asarray(logits, dtype=np.float32)[None, None]
    if batch_index is not None:
        out["batch_index"] = np.asarray([[batch_index]], dtype=np.int32)
    return out


def job_from_row(row: RowRequest, on_tokens: Any, on_error: Any, num_draft_tokens: int = 0) -> Any:
    """An engine Job for one parsed row, delivering through the given sinks; ``num_draft_tokens`` K > 0 decodes
    it speculatively with the engine's own drafter."""
    import torch

    from trtspec.runtimes.inflight.jobs import Job

    return Job(
        tokens=row.tokens,
        max_new=row.max_new,
        on_tokens=on_tokens,
        on_error=on_error,
        sampling=row.sampling,
        end_id=row.end_id,
        draft=row.draft,
        draft_logits=None if row.draft_logits is None else torch.from_numpy(np.array(row.draft_logits)),
        stop_words=row.stop_words,
        bad_words=row.bad_words,
        stream=row.stream,
        return_logits=row.return_logits,
        logprobs=row.logprobs,
        num_draft_tokens=num_draft_tokens,
    )
