"""Hub ids (`org/name[@revision]`) in a spec resolve through huggingface_hub: the local Hugging Face cache offline
(HF_HUB_OFFLINE=1), the cache when the Hub cannot be reached, and one line when neither has the model. The cache is
laid out by the test exactly as huggingface_hub writes it (blobs, snapshots/<commit> symlinks, refs/<branch>)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


def cache_model(cache: Path, repo_id: str, src: Path, commit: str = COMMIT, refs=("main",)) -> Path:
    """Put ``src``'s files into a Hugging Face cache as ``repo_id`` at ``commit`` (blobs + symlinked snapshot)."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        data = f.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (root / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture()
def hf_cache(tmp_path, tiny_pair):
    cache = tmp_path / "hf-cache"
    cache_model(cache, "acme/tiny-target", tiny_pair[0])
    cache_model(cache, "acme/tiny-draft", tiny_pair[1])
    cache_model(cache, "acme/tiny-draft", tiny_pair[1], commit=OTHER_COMMIT, refs=("v1",))
    return cache


def run(*args, cwd, cache, offline=True, timeout=300):
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_ENDPOINT": "http://127.0.0.1:9"}  # no Hub reachable
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "trtspec", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def write(tmp_path, target, draft, **extra):
    path = tmp_path / "trtspec.yaml"
    path.write_text(yaml.safe_dump({"target": {"model": target}, "draft": {"model": draft}, **extra}))
    return path


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "hub-unreachable"])
def test_hub_ids_resolve_from_the_local_cache(tmp_path, hf_cache, offline):
    write(tmp_path, "acme/tiny-target", "acme/tiny-draft@v1")
    r = run("check", "trtspec.yaml", "--json", cwd=tmp_path, cache=hf_cache, offline=offline)
    assert r.returncode == 0, r.stdout + r.stderr
    found = {f["check"]: f for f in json.loads(r.stdout)["findings"]}
    assert found["target model"]["level"] == "ok" and "4 layers" in found["target model"]["detail"]
    assert found["draft model"]["level"] == "ok" and "1 layers" in found["draft model"]["detail"]
    plan = json.loads(run("plan", "trtspec.yaml", "--json", cwd=tmp_path, cache=hf_cache, offline=offline).stdout)
    check_inputs = next(s for s in plan["stages"] if s["name"] == "check")["inputs"]
    assert check_inputs == [
        str(hf_cache / "models--acme--tiny-target" / "snapshots" / COMMIT),
        str(hf_cache / "models--acme--tiny-draft" / "snapshots" / OTHER_COMMIT),
    ]


def test_generate_in_process_loads_hub_ids_from_the_cache(tmp_path, hf_cache, tiny_pair):
    write(tmp_path, "acme/tiny-target", "acme/tiny-draft")
    r = run("generate", "The quick", "-n", "6", "--raw", "--json", cwd=tmp_path, cache=hf_cache)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["token_ids"]) == 6


@pytest.mark.parametrize(
    ("draft", "offline", "message"),
    [
        ("acme/absent", True, "acme/absent: not a local directory, not in the Hugging Face cache"),
        ("acme/absent", True, "and HF_HUB_OFFLINE is set"),
        ("acme/absent", False, "and the Hub could not be reached"),
        ("acme/tiny-draft@v9", True, "acme/tiny-draft@v9: not a local directory, not in the Hugging Face cache"),
    ],
)
def test_a_hub_id_neither_the_hub_nor_the_cache_has_is_one_line(tmp_path, hf_cache, draft, offline, message):
    write(tmp_path, "acme/tiny-target", draft)
    r = run("check", "trtspec.yaml", cwd=tmp_path, cache=hf_cache, offline=offline)
    assert r.returncode == 1
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and message in errors[0] and "hf download" in errors[0], r.stderr
    assert "Traceback" not in r.stderr


def test_a_local_directory_wins_over_a_hub_id_of_the_same_name(tmp_path, hf_cache, tiny_pair):
    import shutil

    shutil.copytree(tiny_pair[1], tmp_path / "acme" / "absent")  # a relative path that looks like a hub id
    write(tmp_path, "acme/tiny-target", "acme/absent")
    assert run("check", "trtspec.yaml", cwd=tmp_path, cache=hf_cache).returncode == 0


def test_parse_hub_id():
    from trtspec.hub import parse_hub_id

    assert parse_hub_id("org/name") == ("org/name", None)
    assert parse_hub_id("org/name@v1.0") == ("org/name", "v1.0")
    for local in ("./org/name", "/abs/path", "models/a/b", "~/x/y", "name", "../org/name"):
        assert parse_hub_id(local) is None, local
