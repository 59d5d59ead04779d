"""`trtspec distill` on a tiny random target: training raises acceptance, resume is exact, bad input is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORDS = (
    "fox dog draft target model token quick brown lazy jumps over the Paris France capital code return add "
    "speculative decoding verifies proposes pass small large"
).split()


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    import random

    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(40)]
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_settings(prompt_file: Path, **train):
    from trtspec.distill.settings import DistillSettings, TrainSettings

    return DistillSettings(
        prompts=prompt_file,
        layers=1,
        head_tokens=256,
        tokens=2000,
        max_new_tokens=24,
        gen_batch_size=16,
        held_out=0.2,
        eval_prompts=8,
        eval_max_tokens=24,
        k=4,
        train=TrainSettings(**{"steps": 60, "batch_size": 8, "lr": 3e-3, "warmup": 5, **train}),
    )


@pytest.fixture(scope="module")
def distilled(tiny_pair, prompt_file, tmp_path_factory):
    from trtspec.distill.pipeline import distill

    out = tmp_path_factory.mktemp("distill") / "draft"
    return distill(tiny_pair[0], out, tiny_settings(prompt_file)), prompt_file


def test_distilled_draft_beats_untrained_draft_of_same_shape(tiny_pair, distilled):
    import torch

    from trtspec.distill.model import draft_from_target
    from trtspec.distill.report import measure
    from trtspec.prompts import encode_prompt, load_prompts, split_prompts
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer

    result, prompt_file = distilled
    settings = tiny_settings(prompt_file)
    target, tok = load_model(tiny_pair[0]), load_tokenizer(tiny_pair[0])
    trained = load_model(result.out)  # a standard LlamaForCausalLM, with the frequent head applied by trtspec's loader
    assert type(trained).__name__ == "LlamaForCausalLM" and type(trained.lm_head).__name__ == "FrequentHead"
    assert trained.lm_head.token_ids.numel() == 256
    untrained = draft_from_target(target, [0], trained.lm_head.token_ids).eval()  # the training's starting point
    train_prompts, held_out = split_prompts(load_prompts(prompt_file), settings.held_out)
    kwargs = dict(k=4, max_tokens=24, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id, costs=False)

    def acceptance(draft, texts):
        with torch.no_grad():
            return measure(target, draft, [encode_prompt(tok, p) for p in texts], **kwargs)

    # On prompts it learned from, the draft follows the random target closely; on held-out prompts a random
    # target's behaviour barely generalizes, but the trained draft still does better than its starting point.
    seen_before, seen_after = acceptance(untrained, train_prompts[:8]), acceptance(trained, train_prompts[:8])
    assert seen_after.identical_greedy and seen_before.identical_greedy  # lossless either way
    assert seen_after.acceptance_rate > seen_before.acceptance_rate + 0.3, (seen_before, seen_after)
    before, after = (acceptance(d, held_out[: settings.eval_prompts]) for d in (untrained, trained))
    assert after.acceptance_rate > before.acceptance_rate, (before, after)
    assert result.report["acceptance_rate"] == pytest.approx(after.acceptance_rate, abs=1e-3)


def test_output_directory_is_complete_and_rerun_is_skipped(tiny_pair, distilled):
    from trtspec.build.artifacts import read_manifest
    from trtspec.distill.pipeline import distill

    result, prompt_file = distilled
    names = {p.name for p in result.out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "distill_report.json", "manifest.json"} <= names
    report = json.loads((result.out / "distill_report.json").read_text())
    for key in ("acceptance_rate", "a", "c", "v", "bound_s", "head_coverage", "train_s", "total_s"):
        assert key in report
    assert 0 < report["c"] < 10 and report["bound_s"] > 0
    assert read_manifest(result.out)["stage"] == "distill"
    again = distill(tiny_pair[0], result.out, tiny_settings(prompt_file))
    assert again.skipped and again.report == result.report


def test_killed_training_resumes_to_the_same_weights(tiny_pair, tmp_path):
    import torch

    from trtspec.distill.data import generate_teacher_data, select_head_tokens, token_counts
    from trtspec.distill.model import draft_from_target
    from trtspec.distill.settings import TrainSettings
    from trtspec.distill.train import train
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer

    target, tok = load_model(tiny_pair[0]), load_tokenizer(tiny_pair[0])
    samples, _ = generate_teacher_data(
        target,
        tok,
        ["the quick fox", "a small draft", "Paris France"],
        tmp_path / "t",
        max_new_tokens=12,
        tokens=100,
        batch_size=2,
        top_k=8,
        eos_ids=[],
    )
    head = select_head_tokens(token_counts(samples, 512), 128)
    settings = TrainSettings(steps=6, batch_size=2, checkpoint_every=2, warmup=2)

    def fresh():
        return draft_from_target(target, [0], head)

    straight = fresh()
    train(straight, samples, settings, tmp_path / "a.pt")

    class Killed(Exception):
        pass

    def kill_at_5(log):
        if log.step == 5:
            raise Killed

    interrupted = fresh()
    with pytest.raises(Killed):
        train(interrupted, samples, settings, tmp_path / "b.pt", on_step=kill_at_5)
    resumed = fresh()  # a new process: weights come from the checkpoint of step 4
    logs, _ = train(resumed, samples, settings, tmp_path / "b.pt")
    assert [x.step for x in logs] == [1, 2, 3, 4, 5, 6]
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_pack_unpack_round_trip_and_wrong_target(tiny_pair, distilled, tmp_path):
    import torch

    from trtspec.distill import DistillError
    from trtspec.distill.pack import pack_draft, unpack_draft
    from trtspec.runtimes.torch.loading import load_model

    result, _ = distilled
    pack_draft(result.out, tiny_pair[0], tmp_path / "packed")
    assert "model.embed_tokens.weight" not in (tmp_path / "packed" / "model.safetensors").read_bytes()[:4096].decode(
        "latin-1"
    )
    unpack_draft(tmp_path / "packed", tiny_pair[0], tmp_path / "unpacked")
    original, restored = load_model(result.out), load_model(tmp_path / "unpacked")
    ids = torch.tensor([[5, 9, 30, 41, 7]])
    with torch.no_grad():
        a, b = original(input_ids=ids).logits, restored(input_ids=ids).logits
    assert torch.equal(a.isfinite(), b.isfinite())
    assert torch.allclose(a[a.isfinite()], b[b.isfinite()], atol=2e-2)
    with pytest.raises(DistillError, match="embeddings"):
        unpack_draft(tmp_path / "packed", tiny_pair[1], tmp_path / "other")


def run_cli(capsys, *args) -> tuple[int, str]:
    """The real entry point in process (exit code, stderr): bad input must fail before torch is even imported."""
    from trtspec.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["distill", *args])
    return int(exc.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "target directory not found"),
        (["--layers", "0"], "--layers 0"),
        (["--head-tokens", "4"], "--head-tokens 4"),
        (["--init-layers", "a,b"], "--init-layers"),
        (["--steps", "0"], "--steps"),
        (["--threads", "0"], "--threads 0"),
        (["--max-draft-len", "17"], "--max-draft-len 17 must be in 1..16"),
    ],
)
def test_cli_bad_input_is_one_line(capsys, tmp_path, tiny_pair, extra, message):
    target = tmp_path / "missing" if not extra else tiny_pair[0]
    code, err = run_cli(capsys, "--target", str(target), "--out", str(tmp_path / "out"), *extra)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 1 and lines[0].startswith("error:") and message in lines[0], err
    assert len(lines) == 2 and lines[1].startswith("hint:") and not (tmp_path / "out").exists()


def test_cli_rejects_out_inside_target_and_model_less_target(capsys, tmp_path, tiny_pair):
    code, err = run_cli(capsys, "--target", str(tiny_pair[0]), "--out", str(tiny_pair[0] / "draft"))
    assert code == 1 and "overlaps" in err
    (tmp_path / "empty").mkdir()
    code, err = run_cli(capsys, "--target", str(tmp_path / "empty"), "--out", str(tmp_path / "out"))
    assert code == 1 and "no config.json" in err


def test_cli_bad_input_does_not_import_torch(tmp_path):
    code = (
        "import sys\nfrom trtspec.cli.main import main\ntry:\n    main(['distill', '--target', sys.argv[1], "
        "'--out', sys.argv[2]])\nexcept SystemExit as e:\n    assert e.code == 1\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "missing"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr


def test_sampled_answers_add_contexts_but_keep_the_target_s_own_labels(tiny_pair, tmp_path):
    """--answers-per-prompt 2: each prompt is answered greedily, then sampled; at every position of either answer the
    label is the target's own distribution at that context (its top-1 is the target's greedy choice there)."""
    import torch

    from trtspec.distill.data import generate_teacher_data
    from trtspec.prompts import encode
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer

    target, tok = load_model(tiny_pair[0]), load_tokenizer(tiny_pair[0])
    chat = [
        {"role": "user", "content": "the quick fox"},
        {"role": "assistant", "content": "jumps over"},
        {"role": "user", "content": "code return add"},
    ]  # a conversation is answered after its whole history, not as its last turn alone
    prompts = ["the quick fox", "a small draft", "Paris France", chat]
    samples, _ = generate_teacher_data(
        target,
        tok,
        prompts,
        tmp_path / "t",
        max_new_tokens=16,
        tokens=10_000,
        batch_size=3,
        top_k=8,
        eos_ids=[],
        answers_per_prompt=2,
        sample_temperature=1.5,
    )
    assert len(samples) == 8
    greedy, sampled = samples[:4], samples[4:]
    for g, s, p in zip(greedy, sampled, prompts):
        assert g.ids[: g.start].tolist() == s.ids[: s.start].tolist() == encode(tok, p)
        assert g.answer.tolist() == g.topk_ids[:, 0].tolist()  # greedy: each token is the label's top-1
    assert greedy[3].ids[: greedy[3].start].tolist() != encode(tok, "code return add")
    assert any(s.answer.tolist() != s.topk_ids[:, 0].tolist() for s in sampled)  # sampled: not always the top-1
    with torch.no_grad():  # labels of a sampled answer are the target's log-probs at that context
        s = next(s for s in sampled if s.answer.tolist() != s.topk_ids[:, 0].tolist())
        logp = torch.log_softmax(target(s.ids[None]).logits[0].float(), -1)[s.start - 1 : s.start - 1 + len(s.answer)]
        top = logp.topk(8, dim=-1)
        assert top.indices.tolist() == s.topk_ids.tolist()
        assert torch.allclose(top.values, s.topk_logp.float(), atol=1e-2)


def test_distilled_draft_is_a_standard_checkpoint_that_proposes_as_its_frequent_head(tiny_pair, distilled):
    """What distill writes reloads with plain transformers (a LlamaForCausalLM over the target's full vocabulary) and
    proposes, greedily, exactly what trtspec's loader makes of it (the frequent head: -inf outside its rows)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trtspec.prompts import encode_prompt, load_prompts
    from trtspec.runtimes.torch.loading import load_model, load_tokenizer

    result, prompt_file = distilled
    config = json.loads((result.out / "config.json").read_text())
    target_config = json.loads((tiny_pair[0] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["vocab_size"] == target_config["vocab_size"] and config["trtspec_frequent_head"]["tokens"] == 256
    plain = AutoModelForCausalLM.from_pretrained(result.out).eval()
    assert type(plain.lm_head) is torch.nn.Linear and plain.lm_head.weight.shape[0] == config["vocab_size"]
    frequent = load_model(result.out)
    assert type(frequent.lm_head).__name__ == "FrequentHead"
    tok = load_tokenizer(tiny_pair[0])
    for text in load_prompts(prompt_file)[:12]:
        ids = torch.tensor([encode_prompt(tok, text)])
        kwargs = dict(max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
        with torch.no_grad():
            assert plain.generate(ids, **kwargs).tolist() == frequent.generate(ids, **kwargs).tolist(), text
    assert (result.out / "ngram_pool.npz").is_file()
    assert result.report["drafters"]["ngram"]["tokens_per_step"] >= 1.0
