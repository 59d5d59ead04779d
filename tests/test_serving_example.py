"""The embedded SmolLM2 example served by Triton: the ensemble's greedy answer (chat template applied) equals the
in-process target-only answer, streamed and not, with the draft's statistics."""

from __future__ import annotations

import pytest

from trtspec.serving.client import TritonLLMClient

pytestmark = [pytest.mark.slow, pytest.mark.triton]

QUESTIONS = ["What is the capital of France?", "How do you say 'thank you' in Japanese? Answer in Japanese."]


@pytest.fixture(scope="module")
def example(tmp_path_factory, example_paths):
    from trtspec.example import example_spec_dict
    from trtspec.pipeline import write_repo
    from trtspec.serving.server import TritonServer
    from trtspec.spec import spec_from_dict

    root = tmp_path_factory.mktemp("example")
    data = example_spec_dict(example_paths.target, example_paths.draft)
    data["triton"] = {"orchestrator_instances": 1}
    spec = spec_from_dict(data, base_dir=root, environ={})
    write_repo(spec)
    with TritonServer(spec.repo_dir, log_file=root / "server.log") as server:
        yield spec, server


def test_example_answers_equal_in_process_target_only_greedy(example):
    from trtspec.runtimes.torch.session import TorchSession

    spec, server = example
    session = TorchSession.from_spec(spec, with_draft=False)
    with TritonLLMClient(server.grpc_url) as client:
        for question in QUESTIONS:
            expected = session.generate(question, 48, use_draft=False, chat=True).text
            answer = client.generate(question, 48, apply_chat_template=True)
            assert answer.text == expected
            # Drafts were proposed and verified (the example's truncated draft is rarely right: acceptance ~0).
            assert answer.stats["total_draft_tokens"] > 0
            assert answer.stats["total_accepted_draft_tokens"] <= answer.stats["total_draft_tokens"]
            streamed = client.generate(question, 48, apply_chat_template=True, stream=True)
            assert "".join(streamed.chunks) == expected and len(streamed.chunks) > 3
