"""logprobs / top_logprobs through the OpenAI API (issue 21), `trtspec serve --openai-port` on a real tritonserver with
the in-process orchestration (tiny pair, the draft a noisy copy of the target so that drafts are partly accepted):
each token's value is the target's own log-softmax at its position (computed here with transformers), the same
streamed as not, the same with the draft (K 4) as without (K 0), on both endpoints; the Triton model returns them
as upstream's output_log_probs / cum_log_probs. The BLS orchestration and the LLM-API runtime refuse them by name
(tests/test_openai_serving.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import openai
import pytest

from tests.openai_helpers import Reference, Served, with_chat_template
from tests.serving_helpers import make_noisy_draft, torch_spec_dict

pytestmark = pytest.mark.triton

NAME = "logprobs"
MESSAGES = [{"role": "user", "content": "The quick brown fox"}]
N = 24


@pytest.fixture(scope="module")
def pair(tiny_pair, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("logprobs-models")
    target = with_chat_template(tiny_pair[0], root / "target")
    return target, make_noisy_draft(target, root / "draft")


@pytest.fixture(scope="module")
def served(pair, tmp_path_factory):
    from trtspec.pipeline import write_repo
    from trtspec.spec import spec_from_dict

    root = tmp_path_factory.mktemp("logprobs")
    spec = spec_from_dict(torch_spec_dict(*pair, name=NAME), base_dir=root, environ={})
    write_repo(spec)
    server = Served(spec.repo_dir, root / "server.log")
    yield server
    assert server.stop() == 0, server.output()


@pytest.fixture(scope="module")
def reference(pair) -> Reference:
    return Reference(pair[0])


def _greedy_logprobs(reference: Reference, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """(the target's greedy tokens, its log-softmax rows at their positions [n, V]) by transformers."""
    torch = reference.torch
    x = torch.tensor([ids])
    with torch.no_grad():
        out = reference.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False)
        new = out[0, len(ids) :].tolist()
        logits = reference.model(out).logits[0, len(ids) - 1 : len(ids) - 1 + len(new)].float()
    return new, torch.log_softmax(logits, -1).numpy()


def _client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0)


def test_chat_logprobs_are_the_targets_streamed_or_not_with_or_without_the_draft(served, reference):
    client = _client(served)
    tokens, ref = _greedy_logprobs(reference, reference.chat_ids(MESSAGES), N)
    kw = dict(model=NAME, messages=MESSAGES, max_tokens=N, temperature=0, logprobs=True, top_logprobs=3)
    runs = {}
    for k in (0, 4):
        plain = client.chat.completions.create(**kw, extra_body={"num_draft_tokens": k})
        assert plain.model_extra["speculative_decoding"]["num_draft_tokens"] == k
        if k:
            assert plain.model_extra["speculative_decoding"]["total_accepted_draft_tokens"] > 0
        chunks = list(client.chat.completions.create(**kw, stream=True, extra_body={"num_draft_tokens": k}))
        streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        content = plain.choices[0].logprobs.content
        assert len(content) == len(tokens) == plain.usage.completion_tokens
        # the same tokens and values (float32 passes of other shapes round in the last bits: 1e-6 here)
        assert [e.token for e in streamed] == [e.token for e in content]
        assert max(abs(a.logprob - b.logprob) for a, b in zip(streamed, content)) < 1e-5
        assert "".join(e.token for e in content) == plain.choices[0].message.content
        runs[k] = content
    for j, (tok, without, with_draft) in enumerate(zip(tokens, runs[0], runs[4])):
        assert abs(without.logprob - float(ref[j, tok])) < 1e-4, j
        assert abs(with_draft.logprob - without.logprob) < 1e-4, j
        assert without.bytes == list(without.token.encode("utf-8"))
        best = np.argsort(-ref[j])[:3]
        assert len(without.top_logprobs) == 3 and without.top_logprobs[0].token == without.token  # greedy: the best
        # within 1e-4 (rounding both to 4 decimals failed once on a value at a rounding boundary: -2.80305)
        got = [e.logprob for e in without.top_logprobs]
        assert got == pytest.approx([float(ref[j, i]) for i in best], abs=1e-4), j


def test_completion_logprobs_streamed_and_not(served, reference):
    client = _client(served)
    prompt = "The quick brown fox"
    tokens, ref = _greedy_logprobs(reference, reference.tok.encode(prompt), 16)
    kw = dict(model=NAME, prompt=prompt, max_tokens=16, temperature=0, logprobs=2)
    plain = client.completions.create(**kw).choices[0]
    lp = plain.logprobs
    assert len(lp.tokens) == len(tokens) and "".join(lp.tokens) == plain.text
    assert all(abs(v - float(ref[j, t])) < 1e-4 for j, (v, t) in enumerate(zip(lp.token_logprobs, tokens)))
    # keyed by text (OpenAI's legacy shape): two tokens that decode alike share a key
    assert all(1 <= len(top) <= 2 and lp.tokens[j] in top for j, top in enumerate(lp.top_logprobs))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(len(lp.tokens))]
    streamed = [c.choices[0].logprobs for c in client.completions.create(**kw, stream=True) if c.choices[0].logprobs]
    assert [t for s in streamed for t in s.tokens] == lp.tokens
    assert np.allclose([v for s in streamed for v in s.token_logprobs], lp.token_logprobs, atol=1e-5)
    assert [o for s in streamed for o in s.text_offset] == lp.text_offset
    assert math.isclose(sum(lp.token_logprobs), float(sum(ref[j, t] for j, t in enumerate(tokens))), abs_tol=1e-3)


def test_the_triton_model_returns_upstreams_log_prob_outputs_and_refuses_a_bad_top(served, reference):
    """Called directly over gRPC (as a TensorRT-LLM client would): output_log_probs per token, cum_log_probs their
    sum; top_logprobs without return_log_probs, or above 20, is refused by the one rule."""
    import tritonclient.grpc as grpcclient

    ids = reference.tok.encode("The quick brown fox")
    tokens, ref = _greedy_logprobs(reference, ids, 8)

    def infer(**extra):
        fields = {
            "input_ids": np.asarray([ids], dtype=np.int32),
            "input_lengths": np.asarray([[len(ids)]], dtype=np.int32),
            "request_output_len": np.asarray([[8]], dtype=np.int32),
            **extra,
        }
        inputs = []
        for name, arr in fields.items():
            x = grpcclient.InferInput(name, list(arr.shape), {np.int32: "INT32", np.bool_: "BOOL"}[arr.dtype.type])
            x.set_data_from_numpy(arr)
            inputs.append(x)
        client = grpcclient.InferenceServerClient(served.grpc_url)
        results = []
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        client.async_stream_infer("tensorrt_llm", inputs)
        client.stop_stream()
        client.close()
        return results[-1]

    result, error = infer(
        return_log_probs=np.asarray([[True]], dtype=np.bool_), exclude_input_in_output=np.asarray([[True]])
    )
    assert error is None, error
    n = int(result.as_numpy("sequence_length").reshape(-1)[0])
    assert result.as_numpy("output_ids").reshape(-1)[:n].tolist() == tokens
    got = result.as_numpy("output_log_probs").reshape(-1)[:n]
    assert np.allclose(got, [ref[j, t] for j, t in enumerate(tokens)], atol=1e-4)
    assert math.isclose(float(result.as_numpy("cum_log_probs").reshape(-1)[0]), float(got.sum()), abs_tol=1e-4)
    for extra, words in (
        ({"top_logprobs": np.asarray([[3]], dtype=np.int32)}, "needs log-probabilities"),
        (
            {"return_log_probs": np.asarray([[True]]), "top_logprobs": np.asarray([[21]], dtype=np.int32)},
            "must be in 0..20",
        ),
    ):
        _, error = infer(**extra)
        assert error is not None and words in str(error), error
