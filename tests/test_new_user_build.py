"""Long commands without a terminal, interrupted, or failing (issue 13, items 9 and 10): progress reaches the log,
Ctrl-C says "interrupted" and what was kept, a failed stage leaves nothing behind, and --help says what is true."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.engine_helpers import engine_spec
from tests.serving_helpers import default_sigint

TRTSPEC = [sys.executable, "-m", "trtspec"]
COMMANDS = ["init", "check", "plan", "quantize", "compile", "build", "repo", "serve", "generate", "bench", "distill"]


def run(*args, cwd=None, env=None, timeout=600):
    return subprocess.run(
        [*TRTSPEC, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "160", **(env or {})},
    )


def _help(command: str) -> str:
    r = run(command, "--help")
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_no_bool_metavar_and_names_the_spec_default_truthfully(command):
    text = _help(command)
    assert "<bool>" not in text
    if "spec_path" in text or "--spec" in text:
        assert "./trtspec.yaml if there is one, else the embedded example" in " ".join(text.split())


def test_help_lists_the_choices_of_closed_options_and_the_quality_stage():
    assert "<target|draft>" in _help("compile") and "<target|draft>" in _help("quantize")
    assert "<trtllm-engine|trtllm-llmapi|torch>" in _help("init")
    assert "quality" in _help("build")
    gen = _help("generate")
    assert "--num-draft-tokens" in gen and "--draft-len" not in gen  # the old name works, hidden
    assert "--max-draft-len" in _help("distill") and "--k " not in _help("distill")


def test_the_spec_comment_lists_the_runtimes_once(tmp_path, tiny_pair):
    r = run("init", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "-o", "s.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in (tmp_path / "s.yaml").read_text().splitlines() if ln.startswith("runtime:"))
    assert line.count("trtllm-llmapi") == 1


def test_the_license_is_an_spdx_expression_setuptools_reads_without_warning():
    import warnings
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parent.parent
    data = tomllib.loads((root / "pyproject.toml").read_text())
    assert data["project"]["license"] == "Apache-2.0"
    assert any(
        re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77 for r in data["build-system"]["requires"]
    )
    try:
        import setuptools
        from setuptools.config.pyprojecttoml import read_configuration
    except ImportError:
        pytest.skip("setuptools is not installed here")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates SPDX license expressions")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_configuration(root / "pyproject.toml")


def _engine_spec_file(tmp_path, tiny_pair):
    spec = engine_spec(tmp_path, tiny_pair, target={"quantization": "none"}, draft={"quantization": "none"})
    path = tmp_path / "trtspec.yaml"
    path.write_text(yaml.safe_dump(spec.to_yaml_dict()))
    return spec, path


def test_a_failed_compile_leaves_no_empty_engines_directory(tmp_path, tiny_pair, trtllm_checkpoints):
    import shutil

    spec, path = _engine_spec_file(tmp_path, tiny_pair)
    for role, ckpt in trtllm_checkpoints.items():  # the checkpoints compile reads, as quantize writes them
        shutil.copytree(ckpt, spec.build_dir / role)
    env = {
        "PATH": os.pathsep.join(
            p
            for p in os.environ["PATH"].split(os.pathsep)
            if not (os.path.isdir(p) and os.path.exists(os.path.join(p, "trtllm-build")))
        )
    }
    r = run("compile", str(path), cwd=tmp_path, env=env)
    assert r.returncode == 1 and "trtllm-build is not on PATH" in r.stderr
    assert not spec.engines_dir.exists()
    assert not (spec.build_dir / ".trtspec-build.lock").exists()


@pytest.mark.slow
def test_quantize_without_a_terminal_logs_every_calibration_batch(tmp_path, tiny_pair):
    path = tmp_path / "trtspec.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "target": {"model": str(tiny_pair[0]), "dtype": "float32", "quantization": "int8_wo"},
                "draft": {"model": str(tiny_pair[1]), "dtype": "float32"},
                "calibration": {"samples": 8, "seq_len": 32, "batch_size": 4},
            }
        )
    )
    r = run("quantize", str(path), "--only", "target", cwd=tmp_path, env={"TRTSPEC_PROGRESS_SECONDS": "0"})
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if re.match(r"\[\d\d:\d\d\.\d\] ", ln)]
    calibration = [ln for ln in lines if "calibrat" in ln]
    assert any(ln.endswith("started, 2 steps") for ln in calibration), r.stderr
    assert any(ln.endswith("1/2 (50%)") for ln in calibration) and any(
        ln.endswith("2/2 (100%)") for ln in calibration
    ), r.stderr


@pytest.mark.slow
def test_ctrl_c_during_build_says_interrupted_and_what_was_kept(tmp_path, tiny_pair, standin_bin):
    spec, path = _engine_spec_file(tmp_path, tiny_pair)
    env = {
        **os.environ,
        "PATH": f"{standin_bin}{os.pathsep}{os.environ['PATH']}",
        "TRTLLM_STANDIN_VERSION": "1.0.0",
        "TRTLLM_STANDIN_SLEEP": "600",
    }
    proc = subprocess.Popen(
        [*TRTSPEC, "build", str(path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,
    )  # as in a terminal
    log = spec.engines_dir / "logs" / "target.trtllm-build.log"
    end = time.monotonic() + 300
    while not (log.is_file() and "Building engine for rank 0" in log.read_text()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the build never reached the target engine"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert (
        "interrupted: during compile:target; its partial output was removed; completed stages kept: "
        "quantize:target, quantize:draft" in err
    )
    assert "run the same command again" in err and "Traceback" not in err
    assert "[" in err and "build: started" in err  # no terminal: progress went to the log
    assert not list(spec.engines_dir.glob(".tmp-*")) and not (spec.build_dir / ".trtspec-build.lock").exists()
