"""The stub watch on real processes shaped like Python-backend stubs (a STAND-IN for tritonserver's children: an
interpreter started under the stub's name with the stub's argv layout, python_backend r24.10 src/stub_launcher.cc);
the same watch against a real tritonserver is in test_stub_watch.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trtspec.serving.stubs import STUB_NAME, StubWatch, expected_stubs, stub_processes


def _fake_stub(tmp_path: Path, model: str, instance: str) -> subprocess.Popen:
    binary = tmp_path / STUB_NAME
    if not binary.exists():
        binary.symlink_to(sys.executable)
    script = tmp_path / "repo" / model / "1" / "model.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("import time\ntime.sleep(120)\n")
    # stub, model path, shm region, shm sizes (2), parent pid, libpython dir, ipc handle, instance name
    return subprocess.Popen(
        [str(binary), str(script), "prefix_region", "1048576", "1048576", str(os.getpid()), "/lib", "336", instance]
    )


def test_the_watch_names_the_model_and_instance_of_a_stub_that_died(tmp_path):
    stubs = [
        _fake_stub(tmp_path, "tensorrt_llm_bls", "tensorrt_llm_bls_0_0"),
        _fake_stub(tmp_path, "tensorrt_llm", "tensorrt_llm_0_0"),
    ]
    try:
        time.sleep(0.3)
        found = stub_processes(os.getpid())
        assert {(s.model, s.instance) for s in found.values()} >= {
            ("tensorrt_llm_bls", "tensorrt_llm_bls_0_0"),
            ("tensorrt_llm", "tensorrt_llm_0_0"),
        }
        watch = StubWatch(os.getpid(), {"tensorrt_llm_bls": 1, "tensorrt_llm": 1})
        assert watch.check() == [] and watch.missing() == {}
        stubs[0].send_signal(signal.SIGSEGV)
        time.sleep(0.3)  # not reaped yet: a zombie, whose exit status says how it died
        (dead,) = watch.check()
        assert (dead.pid, dead.model, dead.instance) == (stubs[0].pid, "tensorrt_llm_bls", "tensorrt_llm_bls_0_0")
        assert dead.how == "killed by SIGSEGV"
        assert watch.check() == []  # reported once
        assert watch.missing() == {"tensorrt_llm_bls": 1}
        stubs[0].wait()
        replacement = _fake_stub(tmp_path, "tensorrt_llm_bls", "tensorrt_llm_bls_0_0")
        stubs.append(replacement)
        time.sleep(0.3)
        assert watch.check() == [] and watch.missing() == {}  # the new stub is adopted
    finally:
        for p in stubs:
            p.kill()
            p.wait()


def test_expected_stubs_are_the_python_models_instance_counts(tmp_path, tiny_pair):
    from tests.serving_helpers import torch_spec_dict
    from trtspec.pipeline import write_repo
    from trtspec.spec import spec_from_dict

    spec = spec_from_dict(
        torch_spec_dict(*tiny_pair, triton={"orchestrator_instances": 2, "orchestration": "bls"}),
        base_dir=tmp_path / "bls",
        environ={},
    )
    expected = expected_stubs(write_repo(spec)["path"])
    assert expected == {
        "preprocessing": expected["preprocessing"],
        "postprocessing": expected["postprocessing"],
        "tensorrt_llm_bls": 2,
        "tensorrt_llm": 1,
        "tensorrt_llm_draft": 1,
    }
    assert "ensemble" not in expected
    # In process: draft and target in one model, one stub per instance.
    spec = spec_from_dict(
        torch_spec_dict(*tiny_pair, triton={"orchestration": "in_process"}),
        base_dir=tmp_path / "in_process",
        environ={},
    )
    expected = expected_stubs(write_repo(spec)["path"])
    assert expected == {
        "preprocessing": expected["preprocessing"],
        "postprocessing": expected["postprocessing"],
        "tensorrt_llm": 1,
    }
