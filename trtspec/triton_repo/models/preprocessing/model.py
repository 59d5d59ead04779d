"""trtspec preprocessing: text_input -> input_ids with the target's tokenizer (TRT-LLM preprocessing contract).

Validates each request by trtspec's request rules (trtspec.validation: max_tokens >= 1, a prompt that is not only
whitespace, within max_input_len in tokens, prompt + max_tokens within max_seq_len; UTF-8; upstream's ensemble inputs
that trtspec does not implement absent or at upstream's default) and answers a bad one with an error response; the
rest of the batch is unaffected.
"""

import os
import sys

# The Python backend stub ignores PYTHONPATH: the server passes trtspec's location in TRTSPEC_PYTHONPATH.
for _path in reversed(os.environ.get("TRTSPEC_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.errors import GenerationError
from trtspec.runtimes.inflight.contract import encode_word_list
from trtspec.triton_repo.runtime_utils import (
    as_bool,
    error_message,
    model_file,
    model_params,
    request_inputs,
    scalar_rows,
)
from trtspec.triton_repo.text import Preprocessor, decode_text, load_tokenizer
from trtspec.validation import (
    UNSUPPORTED_INPUTS,
    validate_max_tokens,
    validate_prompt,
    validate_prompt_tokens,
    validate_unsupported_input,
)


class TritonPythonModel:
    def initialize(self, args):
        p = model_params(args)
        self.pre = Preprocessor(
            load_tokenizer(model_file(args, p["tokenizer_dir"])), as_bool(p.get("add_special_tokens"), True)
        )
        self.max_input_len = int(p["max_input_len"])
        self.max_seq_len = int(p["max_seq_len"])

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._one(request_inputs(request))))
            except Exception as exc:  # noqa: BLE001 - an error response, never a dead model
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error_message(exc))))
        return responses

    def _one(self, x):
        # Declared optional so that a request without them reaches us (trtspec.triton_repo.tensors): refuse it here.
        missing = [
            field for name, field in (("QUERY", "text_input"), ("REQUEST_OUTPUT_LEN", "max_tokens")) if name not in x
        ]
        if missing:
            raise GenerationError(
                f"missing required input(s) {', '.join(missing)}", hint="send text_input (the prompt) and max_tokens"
            )
        query = x["QUERY"].reshape(x["QUERY"].shape[0], -1)
        batch = query.shape[0]
        # Upstream's inputs that trtspec does not implement: absent or upstream's default, else refused by name.
        for name in sorted(set(x) & set(UNSUPPORTED_INPUTS)):
            for b in range(x[name].shape[0]):
                validate_unsupported_input(name, x[name][b])
        out_len = scalar_rows(x.get("REQUEST_OUTPUT_LEN"), batch, None)
        chat = scalar_rows(x.get("APPLY_CHAT_TEMPLATE"), batch, False)
        end_id = scalar_rows(x.get("END_ID"), batch, self.pre.end_id)
        pad_id = scalar_rows(x.get("PAD_ID"), batch, self.pre.pad_id)
        ids, bad, stop = [], [], []
        for b in range(batch):
            # The request rules every door applies (trtspec.validation), in the same words.
            validate_max_tokens(int(out_len[b]))
            text = decode_text(query[b, 0])
            validate_prompt(text)
            tokens = self.pre.encode(text, chat=bool(chat[b]))
            validate_prompt_tokens(len(tokens), int(out_len[b]), self.max_input_len, self.max_seq_len)
            ids.append(tokens)
            bad.append(self.pre.words(x["BAD_WORDS_DICT"][b] if "BAD_WORDS_DICT" in x else [], "bad_words"))
            stop.append(self.pre.words(x["STOP_WORDS_DICT"][b] if "STOP_WORDS_DICT" in x else [], "stop_words"))
        width = max(len(t) for t in ids)
        input_ids = np.full((batch, width), int(pad_id[0]), dtype=np.int32)
        for b, t in enumerate(ids):
            input_ids[b, : len(t)] = t
        return [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([[len(t)] for t in ids], dtype=np.int32)),
            pb_utils.Tensor("BAD_WORDS_IDS", _stack([encode_word_list(w) for w in bad])),
            pb_utils.Tensor("STOP_WORDS_IDS", _stack([encode_word_list(w) for w in stop])),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.array([[int(n)] for n in out_len], dtype=np.int32)),
            pb_utils.Tensor("OUT_END_ID", np.array([[int(e)] for e in end_id], dtype=np.int32)),
            pb_utils.Tensor("OUT_PAD_ID", np.array([[int(e)] for e in pad_id], dtype=np.int32)),
        ]


def _stack(lists):
    width = max(w.shape[1] for w in lists)
    out = np.zeros((len(lists), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, w in enumerate(lists):
        out[i, :, : w.shape[1]] = w
    return out
