"""`trtspec quantize` through its real entry point: outputs, manifests, skipping, the rope guard and bad inputs."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from trtspec.cli.main import main

CALIBRATION = {"samples": 4, "seq_len": 32, "batch_size": 2}


def run(capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process (same code path as the console script) and return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def write_spec(tmp_path, target, draft, runtime="torch", target_q="fp8", draft_q="int8_wo", **extra) -> str:
    data = {
        "runtime": runtime,
        "target": {"model": str(target), "dtype": "float32", "quantization": target_q},
        "draft": {"model": str(draft), "dtype": "float32", "quantization": draft_q},
        "calibration": dict(CALIBRATION),
        **extra,
    }
    path = tmp_path / "trtspec.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def manifest(tmp_path, role: str) -> dict:
    return json.loads((tmp_path / "build" / role / "manifest.json").read_text())


def test_quantize_builds_both_models_with_manifests_and_quality_then_skips_them(tmp_path, tiny_pair, capsys):
    spec = write_spec(tmp_path, *tiny_pair)
    code, out, err = run(capsys, "quantize", spec)
    assert code == 0, err
    for role, fmt in (("target", "fp8"), ("draft", "int8_wo")):
        m = manifest(tmp_path, role)
        assert m["format"] == fmt and m["export"] == "hf-checkpoint" and len(m["source_hash"]) == 64
        assert m["versions"]["nvidia-modelopt"] == "0.47.0" and m["versions"]["transformers"]
        assert m["calibration"]["samples"] == 4 and m["calibration"]["seq_len"] == 32
        assert m["calibration"]["source"].startswith("shipped corpus")
        assert m["timings"]["total_s"] > 0 and m["inputs_hash"]
        assert 0 <= m["quality"]["top1_agreement"] <= 1 and m["quality"]["perplexity_after"] > 1
        assert m["device"] == "cpu" and m["placement"] == {"cpu": 1}  # where the model was calibrated
    quality = json.loads((tmp_path / "build" / "quality.json").read_text())
    assert set(quality["models"]) == {"target", "draft"}
    assert quality["draft_target_top1_agreement"]["before"] is not None
    flat = " ".join(out.split())  # rich wraps lines at the terminal width
    assert "(built in" in flat and "draft vs" in flat and "quantization quality" in flat
    assert flat.count("calibrated on cpu") == 2
    first = manifest(tmp_path, "target")["finished_at"]

    code, out, _ = run(capsys, "quantize", spec)
    assert code == 0 and " ".join(out.split()).count("(up to date)") == 2
    assert manifest(tmp_path, "target")["finished_at"] == first

    data = yaml.safe_load(open(spec))
    data["draft"]["quantization"] = "int4_awq"
    open(spec, "w").write(yaml.safe_dump(data))
    code, out, _ = run(capsys, "quantize", spec, "--only", "draft")
    assert code == 0 and "draft: int4_awq" in out and "target:" not in out
    assert manifest(tmp_path, "draft")["format"] == "int4_awq" and manifest(tmp_path, "target")["finished_at"] == first


def test_trtllm_engine_checkpoints_keep_the_source_rotary_base(tmp_path, tiny_pair, capsys):
    """Fails without the rope fix: ModelOpt 0.47 + transformers 5 write no rotary_base (TRT-LLM then uses 10000)."""
    spec = write_spec(tmp_path, *tiny_pair, runtime="trtllm-engine", target_q="fp8", draft_q="int4_awq")
    code, out, err = run(capsys, "quantize", spec)
    assert code == 0, err
    for role in ("target", "draft"):
        cfg = json.loads((tmp_path / "build" / role / "config.json").read_text())
        assert cfg["rotary_base"] == 100000.0
        assert any("rope_theta=100000" in f for f in manifest(tmp_path, role)["fixes"])
        assert (tmp_path / "build" / role / "tokenizer.json").is_file()
    assert (
        json.loads((tmp_path / "build" / "draft" / "config.json").read_text())["quantization"]["quant_algo"]
        == "W4A16_AWQ"
    )


def test_an_export_that_lost_rotary_base_is_refused_not_written(tmp_path, tiny_pair, capsys, monkeypatch):
    import trtspec.build.export as export

    monkeypatch.setattr(export, "restore_legacy_rope", lambda config, rope: [])  # ModelOpt's behaviour, unfixed
    spec = write_spec(tmp_path, *tiny_pair, runtime="trtllm-engine", target_q="int8_wo", draft_q="none")
    code, _, err = run(capsys, "quantize", spec, "--only", "target")
    assert code == 1 and "rotary_base None" in err and "100000" in err and "Traceback" not in err
    assert not (tmp_path / "build").exists()


@pytest.fixture(scope="session")
def hidden_576(tmp_path_factory, tiny_tokenizer):
    """A one-layer Llama with SmolLM2-135M's widths (hidden 576: not a multiple of the 4-bit block size 128)."""
    from tests.tiny import make_llama

    return make_llama(
        tmp_path_factory.mktemp("h576") / "m",
        tiny_tokenizer,
        hidden=576,
        layers=1,
        heads=9,
        kv_heads=3,
        intermediate=1536,
    )


def _no_weights(tmp_path, tiny_pair):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_pair[0], bare, ignore=shutil.ignore_patterns("*.safetensors"))
    return bare


BAD_INPUTS = {
    "unknown format": ({"target_q": "fp6"}, "'fp6' is not one of"),
    "int4 on hidden 576": ({"target_q": "int4_awq", "target": "h576"}, "has input dimension 576"),
    "nvfp4 on a CPU": ({"target_q": "nvfp4"}, "needs a CUDA GPU"),
    "calibration file missing": ({"calibration": {"file": "missing.jsonl"}}, "calibration file not found"),
    "calibration file empty": ({"calibration": {"file": "empty.txt"}}, "no calibration text"),
    "model without weights": ({"target": "bare"}, "no model weights"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_a_hint_exit_1_and_no_build_output(case, tmp_path, tiny_pair, hidden_576, capsys):
    change, message = BAD_INPUTS[case]
    target = {"h576": hidden_576, "bare": None}.get(change.get("target"), tiny_pair[0])
    if change.get("target") == "bare":
        target = _no_weights(tmp_path, tiny_pair)
    (tmp_path / "empty.txt").write_text("\n\n")
    extra = {"calibration": {**CALIBRATION, **change["calibration"]}} if "calibration" in change else {}
    spec = write_spec(tmp_path, target, tiny_pair[1], target_q=change.get("target_q", "fp8"), **extra)
    code, out, err = run(capsys, "quantize", spec, "--only", "target")
    lines = [line for line in err.splitlines() if line.strip() and "━" not in line]
    assert code == 1, out + err
    assert message in err and "Traceback" not in err
    assert lines[0].startswith("error:") and any(line.startswith("hint:") for line in lines), err
    assert not (tmp_path / "build").exists()
