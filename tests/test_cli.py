"""The CLI through its real entry point: exit codes, one-line errors, no heavy imports at start-up."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

TRTSPEC = [sys.executable, "-m", "trtspec"]


def run(*args, cwd=None, env=None):
    return subprocess.run(
        [*TRTSPEC, *args], capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})}, timeout=300
    )


def test_help_does_not_import_heavy_packages():
    code = (
        "import sys\nfrom trtspec.cli.main import app\nimport typer.testing\n"
        "r = typer.testing.CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
        "heavy = [m for m in ('torch', 'transformers', 'modelopt', 'tritonclient', 'numpy') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def _tiny_spec(tmp_path, target, draft, **extra):
    path = tmp_path / "trtspec.yaml"
    path.write_text(yaml.safe_dump({"target": {"model": str(target)}, "draft": {"model": str(draft)}, **extra}))
    return path


def test_init_writes_a_spec_that_checks(tmp_path, tiny_pair):
    r = run("init", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "-o", "spec.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run("check", "spec.yaml", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["ok"] is True
    again = run("init", "--target", "a", "--draft", "b", "-o", "spec.yaml", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr


def test_check_exits_1_on_tokenizer_difference(tmp_path, tiny_pair):
    from tests.tiny import perturb_tokenizer

    bad = perturb_tokenizer(tiny_pair[1], tmp_path / "bad", token_id=42, new_token="XX-odd")
    r = run("check", str(_tiny_spec(tmp_path, tiny_pair[0], bad)))
    assert r.returncode == 1
    assert "token id 42" in r.stderr and "Traceback" not in r.stderr


def test_check_on_missing_dir_and_corrupt_config_is_one_line_no_traceback(tmp_path, tiny_pair):
    r = run("check", str(_tiny_spec(tmp_path, tmp_path / "missing", tiny_pair[1])))
    assert r.returncode == 1 and "no such model directory" in r.stderr and "Traceback" not in r.stderr
    corrupt = tmp_path / "c"
    shutil.copytree(tiny_pair[1], corrupt)
    (corrupt / "config.json").write_text("[1, 2")
    r = run("check", str(_tiny_spec(tmp_path, tiny_pair[0], corrupt)))
    assert r.returncode == 1 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr


def test_bad_spec_is_one_line_with_hint(tmp_path):
    path = tmp_path / "trtspec.yaml"
    path.write_text(yaml.safe_dump({"target": {"model": "t"}, "draft": {"model": "d", "quantization": "int3"}}))
    r = run("plan", str(path))
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("error: trtspec.yaml: draft.quantization: 'int3' is not one of none, fp8")
    assert lines[1].startswith("hint:")
    r = run("plan", str(tmp_path / "none.yaml"))
    assert r.returncode == 1 and "no such spec file" in r.stderr


def test_debug_variable_shows_traceback(tmp_path):
    r = run("plan", str(tmp_path / "none.yaml"), env={"TRTSPEC_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_plan_json_engine_runtime_lists_speculative_trtllm_build(tmp_path, tiny_pair):
    spec = _tiny_spec(tmp_path, *tiny_pair, runtime="trtllm-engine", speculative={"max_draft_len": 6})
    r = run("plan", str(spec), "--json")
    assert r.returncode == 0, r.stderr
    stages = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    target_cmd = stages["compile:target"]["commands"][0]
    draft_cmd = stages["compile:draft"]["commands"][0]
    assert target_cmd[0] == draft_cmd[0] == "trtllm-build"
    t = " ".join(target_cmd)
    assert "--speculative_decoding_mode draft_tokens_external" in t and "--max_draft_len 6" in t
    for cmd in (target_cmd, draft_cmd):
        i = cmd.index("--use_paged_context_fmha")
        assert cmd[i + 1] == "enable"
    assert "--speculative_decoding_mode" not in draft_cmd
    assert stages["serve"]["commands"][0][-2] == "--docker"


def test_plan_with_draft_logits_gathers_draft_generation_logits(tmp_path, tiny_pair):
    spec = _tiny_spec(tmp_path, *tiny_pair, runtime="trtllm-engine", speculative={"use_draft_logits": True})
    stages = {s["name"]: s for s in json.loads(run("plan", str(spec), "--json").stdout)["stages"]}
    assert "--gather_generation_logits" in stages["compile:draft"]["commands"][0]


@pytest.mark.slow
def test_check_and_plan_on_embedded_example(example_paths):
    r = run("check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "token-to-id mapping" in r.stdout
    r = run("plan", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["spec"]["runtime"] == "torch"


def test_commands_without_spec_use_the_trtspec_yaml_in_the_working_directory(tmp_path, tiny_pair):
    spec = _tiny_spec(tmp_path, *tiny_pair, runtime="trtllm-engine")
    spec.rename(tmp_path / "trtspec.yaml")
    r = subprocess.run(
        [sys.executable, "-m", "trtspec", "plan", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["spec"]["runtime"] == "trtllm-engine" and "using ./trtspec.yaml" in r.stderr


def test_distill_flags_are_the_settings_fields_and_reach_them(monkeypatch, tmp_path):
    """`trtspec distill`'s flags come from DistillSettings/TrainSettings (trtspec.distill.settings): the defaults are
    the classes' own, and every flag lands in its field (the hidden --k, the older name, wins over --max-draft-len)."""
    from pathlib import Path

    import trtspec.distill.pipeline as pipeline
    from trtspec.cli.main import main
    from trtspec.distill.settings import DistillSettings, TrainSettings

    seen: dict = {}

    class Called(BaseException):  # not an Exception: main would turn that into "unexpected" and exit 1
        pass

    def fake_distill(target, out, settings, **kwargs):
        seen.update(settings=settings, **kwargs)
        raise Called

    monkeypatch.setattr(pipeline, "distill", fake_distill)
    monkeypatch.setattr(pipeline, "check_dirs", lambda target, out: None)

    def settings(*args: str):
        with pytest.raises(Called):
            main(["distill", "--target", str(tmp_path / "t"), "--out", str(tmp_path / "o"), *args])
        return seen["settings"]

    assert settings() == DistillSettings() and seen["work_dir"] is None and seen["traffic"] is None
    flags = {
        "--prompts": "p.txt", "--layers": "3", "--init-layers": "0,2,4", "--head-tokens": "100",
        "--intermediate-size": "64", "--tokens": "500", "--max-new-tokens": "16", "--gen-batch-size": "4",
        "--answers-per-prompt": "3", "--sample-temperature": "0.5", "--top-k": "7", "--steps": "9",
        "--batch-size": "2", "--lr": "0.01", "--seed": "5", "--max-draft-len": "6", "--eval-prompts": "3",
        "--eval-max-tokens": "10", "--held-out": "0.2", "--work-dir": "W", "--loss": "tvd", "--device": "cpu",
        "--teacher-dtype": "float32",
    }  # fmt: skip
    got = settings(*[x for kv in flags.items() for x in kv], "--no-bf16", "--no-ngram-pool")
    assert got == DistillSettings(
        prompts=Path("p.txt"), layers=3, init_layers=(0, 2, 4), head_tokens=100, intermediate_size=64, tokens=500,
        max_new_tokens=16, gen_batch_size=4, answers_per_prompt=3, sample_temperature=0.5, top_k=7, held_out=0.2,
        eval_prompts=3, eval_max_tokens=10, k=6, device="cpu", teacher_dtype="float32", ngram_pool=False,
        train=TrainSettings(steps=9, batch_size=2, lr=0.01, seed=5, bf16=False, loss="tvd"),
    )  # fmt: skip
    assert seen["work_dir"] == Path("W")
    got = settings("--k", "3", "--max-draft-len", "5", "--bf16")
    assert got.k == 3 and got.train.bf16 is True
