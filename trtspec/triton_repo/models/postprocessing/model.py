"""trtspec postprocessing: output tokens -> text_output (TRT-LLM postprocessing contract, plus DECODED_LENGTH and
IS_FINAL so that streamed text is exact for multi-byte characters; see trtspec.triton_repo.text)."""

import os
import sys

# The Python backend stub ignores PYTHONPATH: the server passes trtspec's location in TRTSPEC_PYTHONPATH.
for _path in reversed(os.environ.get("TRTSPEC_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.triton_repo.runtime_utils import (
    as_bool,
    error_message,
    model_file,
    model_params,
    request_inputs,
    scalar_rows,
)
from trtspec.triton_repo.text import Postprocessor, load_tokenizer


class TritonPythonModel:
    def initialize(self, args):
        p = model_params(args)
        self.post = Postprocessor(
            load_tokenizer(model_file(args, p["tokenizer_dir"])), as_bool(p.get("skip_special_tokens"), True)
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=[self._one(request_inputs(request))]))
            except Exception as exc:  # noqa: BLE001
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error_message(exc))))
        return responses

    def _one(self, x):
        tokens = x["TOKENS_BATCH"]  # [B, beam, L]
        lengths = x["SEQUENCE_LENGTH"].reshape(tokens.shape[0], -1)
        batch = tokens.shape[0]
        decoded = scalar_rows(x.get("DECODED_LENGTH"), batch, 0)
        final = scalar_rows(x.get("IS_FINAL"), batch, True)
        texts = []
        for b in range(batch):
            seq = tokens[b, 0, : int(lengths[b, 0])].tolist()
            texts.append([self.post.delta(seq, int(decoded[b]), bool(final[b])).encode("utf-8")])
        return pb_utils.Tensor("OUTPUT", np.array(texts, dtype=np.object_))
