"""One request contract at every door (issue 21): a shared table of good and bad requests, every row sent through
every door that can carry it, against real servers of both orchestrations (tiny pair, torch runtime,
``max_draft_len`` 4, ``max_input_len`` 256), one outcome per row: the same text (good rows; the same token ids at the
token-level doors) or the same rule's message (bad rows: a 400 in OpenAI's shape at the OpenAI API, exit 1 at the
CLI, an error response at Triton's doors).

Doors: ``trtspec generate`` in process (``--spec``) and through a server (``--url``, gRPC and HTTP), the OpenAI API
(``/v1/completions``), the ensemble over gRPC (stream) and HTTP (``generate``), and each draft-target model called
directly with tokens: the BLS orchestrator (``tensorrt_llm_bls``) and the in-process torch model (``tensorrt_llm`` of
orchestration in_process).

A door a row cannot reach is named with the reason (``SKIP``): a text rule (empty prompt) at a door that takes
tokens; a value an INT32 tensor cannot carry (Triton's HTTP JSON parser wraps ``max_tokens`` 4294967301 to 5 before
any model sees it: no trtspec code can tell it from 5).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.openai_helpers import Served
from tests.serving_helpers import torch_spec_dict
from tests.upstream import facts
from trtspec.spec import spec_from_dict
from trtspec.triton_repo.names import BLS, ENSEMBLE, TARGET

pytestmark = [pytest.mark.triton, pytest.mark.slow]

NAME = "contract"
PROMPT = "The quick brown fox"
LONG = "hello " * 300  # more than max_input_len (256) in tokens, fewer characters than the OpenAI frontend's bound
INT32_WRAP = 2**32 + 5  # 4294967301: Triton's JSON parser makes it 5

TEXT_DOORS = ("cli", "cli --url grpc", "cli --url http", "openai", "ensemble grpc", "ensemble http")
TOKEN_DOORS = ("bls", "in-process model")
DOORS = TEXT_DOORS + TOKEN_DOORS
NO_TEXT = "a text rule: this door takes token ids"
INT32 = "an INT32 tensor cannot carry it (over HTTP JSON Triton wraps it before any model sees it)"
TYPED = "typed at this door (CLI options, Triton tensors): only JSON can send the wrong type"


@dataclass(frozen=True)
class Row:
    """One request in ensemble field names; ``error`` is the rule's message (None: served)."""

    id: str
    fields: dict[str, Any]
    error: str | None = None
    skip: dict[str, str] = field(default_factory=dict)  # door -> why it cannot carry this row
    openai: dict[str, Any] | None = None  # a body of its own at the OpenAI door (types JSON alone can send)
    endpoint: str = "completions"
    hint: str | None = None  # a part of the rule's hint every door must pass on
    own: bool = False  # served with a text of its own: the in-process model's at K 0 for the same fields


def _row(
    id: str, error: str | None = None, skip: dict[str, str] | None = None, hint: str | None = None, **fields: Any
) -> Row:
    return Row(id, {"text_input": PROMPT, "max_tokens": 8, **fields}, error, skip or {}, hint=hint)


def _openai_only(id: str, body: dict[str, Any], error: str, endpoint: str = "completions") -> Row:
    return Row(id, {}, error, {d: TYPED for d in DOORS if d != "openai"}, body, endpoint)


# Upstream's ensemble inputs that trtspec does not implement (issue 23, item 7): declared, so a request carrying one
# is not Triton's "unexpected inference input"; its absence and upstream's default are served as the greedy text, any
# other value is refused by name in preprocessing. Inputs trtspec honours are served (values that leave greedy
# output unchanged). Only the ensemble doors take these fields.
ENSEMBLE_ONLY = {
    d: "not a field of this door: only TensorRT-LLM's ensemble contract has it" for d in DOORS if "ensemble" not in d
}
UNSUPPORTED = "is not supported by trtspec's draft-target models"
NOT_DEFAULT = {  # input -> a value other than upstream's default
    "decoder_text_input": "a decoder prompt",
    "num_return_sequences": 2,
    "length_penalty": 0.5,
    "return_log_probs": True,
    "return_context_logits": True,
    "return_generation_logits": True,
    "beam_width": 2,
    "prompt_embedding_table": [[0.5, 0.25]],
    "prompt_table_extra_id": 7,
    "prompt_vocab_size": 4,
    "embedding_bias_words": ["fox"],
    "embedding_bias_weights": [1.5, 0.5],
    "lora_task_id": 1,
    "lora_weights": [[0.5, 0.25]],
    "lora_config": [[0, 0, 1]],
    "guided_decoding_guide_type": "json",
    "guided_decoding_guide": "{}",
}
DEFAULTS = {  # upstream's default values: served as if absent
    "decoder_text_input": "",
    "num_return_sequences": 1,
    "length_penalty": 1.0,
    "repetition_penalty": 1.0,
    "min_tokens": 1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "return_log_probs": False,
    "return_context_logits": False,
    "return_generation_logits": False,
    "beam_width": 1,
    "prompt_vocab_size": 0,
}
HONOURED = {  # trtspec implements these: a value that leaves greedy output unchanged is served, and the same
    "seed": 7,
    "return_perf_metrics": True,
    "return_num_input_tokens": True,
    "return_num_output_tokens": True,
    "stop_words": ["\u2603\u2603\u2603"],
    "bad_words": ["\u2603\u2603\u2603"],
}


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# Measured: Triton's HTTP generate extension answers "The schema can not convert input ... to tensor with proper
# shape" for a numeric array, before any model sees it (string lists pass).
NUMERIC_ARRAY = "Triton's HTTP generate extension cannot carry a numeric array; the gRPC door sends it"


def _upstream_rows() -> list[Row]:
    rows = []
    for name, value in NOT_DEFAULT.items():
        error = f"{name} {UNSUPPORTED}" if isinstance(value, (list, str)) else f"{name} {_shown(value)} {UNSUPPORTED}"
        numeric = isinstance(value, list) and not isinstance(value[0], str)
        skip = {**ENSEMBLE_ONLY, **({"ensemble http": NUMERIC_ARRAY} if numeric else {})}
        rows.append(_row(f"{name} {_shown(value)}", error, skip, hint=f"leave {name} out", **{name: value}))
    rows += [_row(f"{n} {_shown(v)} (default)", None, ENSEMBLE_ONLY, **{n: v}) for n, v in DEFAULTS.items()]
    rows.append(_row("min_tokens 0 (default)", None, ENSEMBLE_ONLY, min_tokens=0))
    rows += [_row(f"{n} {_shown(v)} (honoured)", None, ENSEMBLE_ONLY, **{n: v}) for n, v in HONOURED.items()]
    return rows


# The sampling fields beyond temperature/top-k/top-p, by their ensemble (and OpenAI, and engine) names.
PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_tokens")
K = "num_draft_tokens must be in 0..4, got"
BOUND = "this deployment's max_draft_len is 4"
ROWS = [
    _row("greedy"),
    _row("K 0 (target only)", num_draft_tokens=0),
    _row("K 4 (max_draft_len)", num_draft_tokens=4),
    _row("K 5", f"{K} 5", hint=BOUND, num_draft_tokens=5),
    _row("K 16", f"{K} 16", hint=BOUND, num_draft_tokens=16),
    _row("K -1", "num_draft_tokens must be >= 0, got -1", num_draft_tokens=-1),
    _row("temperature -1", "temperature must be >= 0, got -1.0", temperature=-1.0),
    _row("top_p 2", "top_p must be in (0, 1], got 2.0", temperature=0.8, top_p=2.0),
    _row("top_p 0", "top_p must be in (0, 1], got 0.0", temperature=0.8, top_p=0.0),
    _row("top_p -1", "top_p must be in (0, 1], got -1.0", temperature=0.8, top_p=-1.0),
    _row("top_k -1 greedy", "top_k must be >= 0, got -1", top_k=-1),
    _row("top_k -1 sampled", "top_k must be >= 0, got -1", temperature=0.8, top_k=-1),
    _row("max_tokens 0", "max_tokens must be >= 1, got 0", max_tokens=0),
    _row(
        "max_tokens 2**32+5",
        f"max_tokens must be at most 2147483647 (2**31-1), got {INT32_WRAP}",
        {d: INT32 for d in DOORS if not d.startswith(("cli", "openai"))},
        max_tokens=INT32_WRAP,
    ),
    # penalties and min_tokens (issue 21): honoured at every door, the same text with and without a draft
    Row(
        "penalties",
        {"text_input": PROMPT, "max_tokens": 8, "repetition_penalty": 1.5, "frequency_penalty": 1.0},
        own=True,
    ),
    Row(
        "penalties K 4",
        {
            "text_input": PROMPT,
            "max_tokens": 8,
            "presence_penalty": 1.5,
            "frequency_penalty": 0.5,
            "num_draft_tokens": 4,
        },
        own=True,
    ),
    _row("min_tokens 8", min_tokens=8),
    _row("repetition_penalty 0", "repetition_penalty must be > 0, got 0.0", repetition_penalty=0.0),
    _row("presence_penalty 2.5", "presence_penalty must be in -2..2, got 2.5", presence_penalty=2.5),
    _row("frequency_penalty -3", "frequency_penalty must be in -2..2, got -3.0", frequency_penalty=-3.0),
    _row("min_tokens -1", "min_tokens must be >= 0, got -1", min_tokens=-1),
    _row("empty prompt", "the prompt is empty", {d: NO_TEXT for d in TOKEN_DOORS}, text_input=""),
    _row("whitespace prompt", "the prompt is empty", {d: NO_TEXT for d in TOKEN_DOORS}, text_input=" \n\t "),
    _row("prompt over max_input_len", "tokens, more than max_input_len (256)", text_input=LONG),
    _row("prompt + max_tokens over max_seq_len", "exceeds max_seq_len (512)", max_tokens=510),
    _openai_only("max_tokens '8'", {"prompt": PROMPT, "max_tokens": "8"}, "invalid value for 'max_tokens'"),
    _openai_only("max_tokens true", {"prompt": PROMPT, "max_tokens": True}, "invalid value for 'max_tokens'"),
    _openai_only("stream 'yes'", {"prompt": PROMPT, "max_tokens": 8, "stream": "yes"}, "invalid value for 'stream'"),
    _openai_only(
        "content null",
        {"messages": [{"role": "user", "content": None}], "max_tokens": 8},
        "invalid value for 'messages.0.content'",
        "chat/completions",
    ),
    _openai_only(
        "content missing",
        {"messages": [{"role": "user"}], "max_tokens": 8},
        "missing required parameter: 'messages.0.content'",
        "chat/completions",
    ),
    *_upstream_rows(),
]


# -- the servers: one per orchestration ---------------------------------------------------------------------------
def _spec_data(tiny_pair, **triton):
    return torch_spec_dict(
        *tiny_pair,
        name=NAME,
        engine={"max_input_len": 256, "max_seq_len": 512},
        speculative={"max_draft_len": 4, "route_threshold": 0, "drafter": "model"},
        triton={"orchestrator_instances": 1, **triton},
    )


@pytest.fixture(scope="module")
def servers(tiny_pair, tmp_path_factory):
    """The BLS orchestration behind `trtspec serve --openai-port` (OpenAI API, ensemble, tensorrt_llm_bls) and the
    in-process orchestration on a TritonServer (ensemble, the in-process tensorrt_llm); the spec file the CLI reads."""
    from trtspec.pipeline import write_repo
    from trtspec.serving.server import TritonServer

    root = tmp_path_factory.mktemp("contract")
    specs = {}
    for kind, orchestration in (("bls", "bls"), ("in_process", "in_process")):
        data = _spec_data(tiny_pair, orchestration=orchestration)
        specs[kind] = spec_from_dict(data, base_dir=root / kind, environ={})
        write_repo(specs[kind])
    spec_file = root / "trtspec.yaml"
    spec_file.write_text(yaml.safe_dump(_spec_data(tiny_pair)))
    served = Served(specs["bls"].repo_dir, root / "bls.log")
    try:
        with TritonServer(specs["in_process"].repo_dir, log_file=root / "in_process.log") as inproc:
            yield {"bls": served, "in_process": inproc, "spec_file": spec_file, "target": tiny_pair[0]}
    finally:
        served.stop()


# -- the doors: each returns ("ok", text or token ids) or ("error", message) --------------------------------------
def _cli(row: Row, *where: str) -> tuple[str, Any]:
    f = row.fields
    args = [f["text_input"], "-n", str(f["max_tokens"]), "--raw", "--json", *where]
    for name in ("temperature", "top_k", "top_p", *PENALTIES, "num_draft_tokens"):
        if name in f:
            args += ["--" + name.replace("_", "-"), str(f[name])]
    r = subprocess.run(
        [sys.executable, "-m", "trtspec", "generate", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400"},
    )
    if r.returncode == 0:
        out = json.loads(r.stdout)
        return "ok", out["text"]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    return "error", " ".join(r.stderr.split())


def _openai(row: Row, base_url: str) -> tuple[str, Any]:
    if row.openai is not None:
        body = {"model": NAME, **row.openai}
    else:
        f = row.fields
        body = {"model": NAME, "prompt": f["text_input"], "max_tokens": f["max_tokens"]}
        body["temperature"] = f.get("temperature", 0.0)  # OpenAI's default is 1.0; the others' is greedy
        body.update({k: f[k] for k in ("top_k", "top_p", *PENALTIES, "num_draft_tokens") if k in f})
    r = httpx.post(f"{base_url}/{row.endpoint}", json=body, timeout=120)
    if r.status_code == 200:
        return "ok", r.json()["choices"][0]["text"]
    error = r.json()["error"]
    assert r.status_code == 400 and error["type"] == "invalid_request_error", r.text
    return "error", error["message"]


_NUMPY = {
    "STRING": ("BYTES", np.object_),
    "INT32": ("INT32", np.int32),
    "UINT64": ("UINT64", np.uint64),
    "FP32": ("FP32", np.float32),
    "FP16": ("FP16", np.float16),
    "BOOL": ("BOOL", np.bool_),
}
# Each field with upstream's type (tests/upstream/ensemble_inputs.json), plus trtspec's num_draft_tokens.
ENSEMBLE_TYPES = {
    **{i["name"]: _NUMPY[i["data_type"]] for i in facts.ensemble_inputs()},
    "num_draft_tokens": ("INT32", np.int32),
}
TOKEN_NAMES = {"temperature": "temperature", "top_k": "runtime_top_k", "top_p": "runtime_top_p"}


def _tensor(name: str, value: Any, dtype: str, np_type: Any) -> Any:
    import tritonclient.grpc as grpcclient

    arr = np.asarray(value, dtype=np_type)
    x = grpcclient.InferInput(name, list(arr.shape), dtype)
    x.set_data_from_numpy(arr)
    return x


def _grpc_stream(url: str, model: str, inputs: list) -> tuple[str, list]:
    """("ok", the responses) or ("error", the first error) of one request over the gRPC stream."""
    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    results = []
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            result, error = got.get(timeout=120)
            if error is not None:
                return "error", str(error)
            results.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return "ok", results
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def _ensemble_grpc(row: Row, url: str) -> tuple[str, Any]:
    values = {**row.fields, "stream": False, "exclude_input_in_output": True}
    inputs = []
    for name, value in values.items():
        dtype, np_type = ENSEMBLE_TYPES[name]
        if isinstance(value, list):  # a [-1] or [-1, -1] input: the list is the request's row
            row = [v.encode() if isinstance(v, str) else v for v in value]
        else:
            row = [value.encode() if isinstance(value, str) else value]
        inputs.append(_tensor(name, [row], dtype, np_type))
    status, out = _grpc_stream(url, ENSEMBLE, inputs)
    if status == "error":
        return status, out
    return "ok", "".join(
        b"".join(bytes(t) for t in r.as_numpy("text_output").reshape(-1)).decode()
        for r in out
        if r.as_numpy("text_output") is not None
    )


def _ensemble_http(row: Row, url: str) -> tuple[str, Any]:
    body = {**row.fields, "stream": False, "exclude_input_in_output": True}
    req = urllib.request.Request(
        f"http://{url}/v2/models/{ENSEMBLE}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            data = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return "error", json.loads(exc.read())["error"]
    text = data["text_output"]
    return "ok", "".join(text) if isinstance(text, list) else text


def _tokens(row: Row, url: str, model: str, target) -> tuple[str, Any]:
    """The draft-target model called directly with the prompt's token ids, as preprocessing makes them."""
    from trtspec.triton_repo.text import Preprocessor, load_tokenizer

    pre = Preprocessor(load_tokenizer(target), True)
    f = row.fields
    ids = pre.encode(f["text_input"])
    inputs = [
        _tensor("input_ids", [ids], "INT32", np.int32),
        _tensor("input_lengths", [[len(ids)]], "INT32", np.int32),
        _tensor("request_output_len", [[f["max_tokens"]]], "INT32", np.int32),
        _tensor("end_id", [[pre.end_id]], "INT32", np.int32),
        _tensor("pad_id", [[pre.pad_id]], "INT32", np.int32),
        _tensor("streaming", [[False]], "BOOL", np.bool_),
        _tensor("exclude_input_in_output", [[True]], "BOOL", np.bool_),
    ]
    for name in ("temperature", "top_k", "top_p", *PENALTIES, "num_draft_tokens"):
        if name in f:
            dtype, np_type = ENSEMBLE_TYPES[name]
            inputs.append(_tensor(TOKEN_NAMES.get(name, name), [[f[name]]], dtype, np_type))
    status, out = _grpc_stream(url, model, inputs)
    if status == "error":
        return status, out
    tokens: list[int] = []
    for r in out:
        if r.as_numpy("output_ids") is not None:
            n = int(r.as_numpy("sequence_length").reshape(-1)[0])
            tokens += r.as_numpy("output_ids").reshape(-1)[:n].tolist()
    return "ok", tokens


def _send(door: str, row: Row, s: dict) -> tuple[str, Any]:
    bls, inproc = s["bls"], s["in_process"]
    if door == "cli":
        return _cli(row, "--spec", str(s["spec_file"]))
    if door == "cli --url grpc":
        return _cli(row, "--url", inproc.grpc_url)
    if door == "cli --url http":
        return _cli(row, "--url", f"http://127.0.0.1:{bls.ports['http']}")
    if door == "openai":
        return _openai(row, bls.base_url)
    if door == "ensemble grpc":
        return _ensemble_grpc(row, inproc.grpc_url)
    if door == "ensemble http":
        return _ensemble_http(row, f"127.0.0.1:{bls.ports['http']}")
    if door == "bls":
        return _tokens(row, bls.grpc_url, BLS, s["target"])
    assert door == "in-process model"
    return _tokens(row, inproc.grpc_url, TARGET, s["target"])


@pytest.fixture(scope="module")
def greedy_ids(servers):
    """The target's greedy token ids for PROMPT (the in-process model, K 0): what every good row's token doors
    return, and, decoded, every text door's text (greedy draft-target output is the target's)."""
    status, ids = _send("in-process model", _row("reference", num_draft_tokens=0), servers)
    assert status == "ok" and len(ids) == 8, ids
    return ids


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_every_door_gives_the_same_outcome(servers, greedy_ids, row):
    from transformers import AutoTokenizer

    want_ids = greedy_ids
    if row.own:  # the target's own output for these fields: the in-process model at K 0
        status, want_ids = _send("in-process model", Row(row.id, {**row.fields, "num_draft_tokens": 0}), servers)
        assert status == "ok" and want_ids != greedy_ids, want_ids  # the fields change the text
    text = AutoTokenizer.from_pretrained(servers["target"]).decode(want_ids, skip_special_tokens=True)
    outcomes = {door: _send(door, row, servers) for door in DOORS if door not in row.skip}
    wrong = {}
    for door, (status, got) in outcomes.items():
        if row.error is None:
            want = ("ok", want_ids if door in TOKEN_DOORS else text)
            if (status, got) != want:
                wrong[door] = (status, got)
        elif status != "error" or row.error not in got:
            wrong[door] = (status, got)
    assert not wrong, f"{row.id}: expected {row.error or 'served, ' + repr(text)}; these doors differ: {wrong}"
    if row.hint is not None:  # the rule's hint travels with its message through every door
        assert all(row.hint in got for _, got in outcomes.values()), outcomes
