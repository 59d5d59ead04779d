"""`trtspec generate` in process: JSON output, --no-draft equality, bad input as one line and exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml


def run(*args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "trtspec", "generate", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def spec_file(tiny_pair, tmp_path_factory):
    path = tmp_path_factory.mktemp("gen") / "trtspec.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "target": {"model": str(tiny_pair[0]), "dtype": "float32"},
                "draft": {"model": str(tiny_pair[1]), "dtype": "float32"},
                "speculative": {"max_draft_len": 3},
            }
        )
    )
    return path


def test_generate_json_speculative_equals_no_draft(spec_file):
    spec = run("The quick", "--spec", str(spec_file), "-n", "24", "--raw", "--json")
    plain = run("The quick", "--spec", str(spec_file), "-n", "24", "--raw", "--json", "--no-draft")
    assert spec.returncode == 0 and plain.returncode == 0, spec.stderr + plain.stderr
    a, b = json.loads(spec.stdout), json.loads(plain.stdout)
    assert set(a) == {"text", "token_ids", "stats"}
    assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"] and len(a["token_ids"]) == 24
    assert a["stats"]["total_draft_tokens"] > 0 and b["stats"]["total_draft_tokens"] == 0
    sampled = [
        json.loads(
            run(
                "The quick",
                "--spec",
                str(spec_file),
                "-n",
                "12",
                "--raw",
                "--json",
                "--temperature",
                "1.0",
                "--top-k",
                "20",
                "--seed",
                "3",
            ).stdout
        )["token_ids"]
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


def test_logprobs_in_json_are_the_same_with_and_without_the_draft(spec_file):
    args = ("The quick", "--spec", str(spec_file), "-n", "12", "--raw", "--json", "--logprobs", "2")
    spec, plain = json.loads(run(*args).stdout), json.loads(run(*args, "--no-draft").stdout)
    assert spec["token_ids"] == plain["token_ids"] and spec["stats"]["total_draft_tokens"] > 0
    for a, b, token in zip(spec["logprobs"], plain["logprobs"], spec["token_ids"]):
        assert a["token"] == b["token"] == token and abs(a["logprob"] - b["logprob"]) < 1e-4
        assert len(a["top"]) == 2 and a["top"][0]["token"] == token and a["logprob"] <= 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["hello", "--draft-len", "17"], "num_draft_tokens must be in 0..3, got 17"),  # the spec's max_draft_len
        (["hello", "--num-draft-tokens", "-1"], "num_draft_tokens must be >= 0, got -1"),
        (["hello", "-k", "4", "--no-draft"], "exclude each other"),
        (["", "-n", "4"], "prompt is empty"),
        (["hello", "--max-tokens", "0"], "max_tokens must be >= 1, got 0"),
        (["hello " * 3000, "--raw", "-n", "4"], "more than max_input_len (2048)"),  # as preprocessing counts it
        (["hello", "--top-p", "0"], "top_p must be in (0, 1]"),
        (["hello", "--logprobs", "21"], "--logprobs must be in 0..20, got 21"),
        (["hello", "--logprobs", "2", "--stream"], "--logprobs is served in process without --stream only"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(spec_file, args, message):
    r = run(*args, "--spec", str(spec_file))
    assert r.returncode == 1, r.stdout + r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr


def test_pair_with_different_vocabularies_is_refused(tiny_pair, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.tiny import make_llama

    other = make_llama(tmp_path / "other", tiny_tokenizer, layers=1)
    model = AutoModelForCausalLM.from_pretrained(other)
    model.resize_token_embeddings(model.config.vocab_size + 64)
    model.save_pretrained(other)
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"target": {"model": str(tiny_pair[0])}, "draft": {"model": str(other)}}))
    r = run("hello", "--spec", str(spec), "-n", "4")
    assert r.returncode == 1 and "vocabulary" in r.stderr and "Traceback" not in r.stderr
