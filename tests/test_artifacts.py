from __future__ import annotations

import pytest

from trtspec.build.artifacts import atomic_dir, hash_inputs, is_up_to_date, read_manifest, write_manifest


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise RuntimeError("killed mid-stage")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_previous_output(tmp_path):
    final = tmp_path / "out"
    for content in ("one", "two"):
        with atomic_dir(final) as tmp:
            (tmp / "f").write_text(content)
            write_manifest(tmp, {"inputs_hash": content})
    assert (final / "f").read_text() == "two"
    assert read_manifest(final)["inputs_hash"] == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_inputs_hash_changes_with_content_and_settings(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "w").write_bytes(b"abc")
    h1 = hash_inputs({"model": src}, {"fmt": "fp8"})
    assert h1 == hash_inputs({"model": src}, {"fmt": "fp8"})
    assert h1 != hash_inputs({"model": src}, {"fmt": "int8_wo"})
    (src / "w").write_bytes(b"abd")
    h2 = hash_inputs({"model": src}, {"fmt": "fp8"})
    assert h2 != h1
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        write_manifest(tmp, {"inputs_hash": h2})
    assert is_up_to_date(out, h2) and not is_up_to_date(out, h1)


def test_large_file_digest_is_cached_by_size_and_mtime(tmp_path, monkeypatch):
    import os

    from trtspec.build import artifacts

    monkeypatch.setenv("TRTSPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(artifacts, "_DIGESTS", artifacts._DigestCache())
    monkeypatch.setattr(artifacts._DigestCache, "MIN_SIZE", 4)
    f = tmp_path / "weights.bin"
    f.write_bytes(b"abcdefgh")
    first = artifacts.hash_file(f)
    reads = []
    monkeypatch.setattr(artifacts, "_sha256_file", lambda p: reads.append(p) or "recomputed")
    assert artifacts.hash_file(f) == first and reads == []  # unchanged: served from the cache
    f.write_bytes(b"abcdefgX")
    os.utime(f, ns=(1, 1))
    assert artifacts.hash_file(f) == "recomputed" and reads == [f]


def test_stale_temporaries_of_dead_runs_are_removed_and_a_live_process_s_kept(tmp_path):
    import os
    import subprocess
    import sys

    from trtspec.build.stages import clean_stale_temporaries

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    out = tmp_path / "target"
    leftovers = [tmp_path / f".tmp-target-{dead_pid}-1", tmp_path / f".old-target-{dead_pid}-2"]
    live = tmp_path / f".tmp-target-{os.getpid()}-3"  # a run still writing this output
    other = tmp_path / f".tmp-draft-{dead_pid}-4"  # another output's: not asked about
    for d in (*leftovers, live, other):
        d.mkdir()
    assert sorted(clean_stale_temporaries([out])) == sorted(leftovers)
    assert live.is_dir() and other.is_dir() and not any(d.exists() for d in leftovers)
