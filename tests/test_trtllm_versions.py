"""The per-version trtllm-build table: generated commands are checked against each version's documented flags."""

from __future__ import annotations

import itertools

import pytest

from tests.engine_helpers import engine_spec
from tests.standin.trtllm_build_standin import make_parser
from trtspec.errors import EngineBuildError
from trtspec.trtllm.trtllm_build import trtllm_build_command, validate_command
from trtspec.trtllm.trtllm_versions import (
    NGC_TAGS,
    RELEASES,
    get_release,
    image_trtllm_version,
    ngc_image,
    normalize_version,
    release_line,
)

VERSIONS = {"0.20": "0.20.0", "0.21": "0.21.0", "1.0": "1.0.0", "1.1": "1.1.0", "1.2": "1.2.0"}


def test_table_covers_the_five_release_lines():
    assert set(RELEASES) == set(VERSIONS)


@pytest.mark.parametrize("line", sorted(VERSIONS))
def test_every_release_documents_the_draft_target_flags(line):
    r = RELEASES[line]
    assert set(r.speculative_modes) == {
        "draft_tokens_external",
        "lookahead_decoding",
        "medusa",
        "explicit_draft_tokens",
        "eagle",
    }
    assert r.flag("--max_draft_len").type is int
    assert r.flag("--use_paged_context_fmha").choices == ("enable", "disable")
    assert r.flag("--use_fp8_context_fmha").choices == ("enable", "disable")
    assert r.flag("--gather_generation_logits").kind == "switch"
    assert set(r.flag("--kv_cache_type").choices) == {"continuous", "paged", "disabled"}
    assert {"auto", "float16", "bfloat16", "float32", "fp8", "nvfp4", "disable"} <= set(r.flag("--gemm_plugin").choices)
    assert r.flag("--logits_dtype").choices == ("float16", "float32")
    assert r.flag("--max_decoder_seq_len") is r.flag("--max_seq_len")  # argparse alias
    assert r.flag("--tp_size") is None  # the mapping comes from the checkpoint, not from a flag


def test_auto_parallel_flags_are_gone_from_1_2_only():
    for line in ("0.20", "0.21", "1.0", "1.1"):
        assert {"--auto_parallel", "--gpus_per_node", "--cluster_key"} <= RELEASES[line].flag_names
    assert not {"--auto_parallel", "--gpus_per_node", "--cluster_key"} & RELEASES["1.2"].flag_names


_VARIANTS = [
    {},
    {"speculative": {"use_draft_logits": True, "max_draft_len": 7}},
    {"target": {"kv_cache": "fp8", "tp_size": 2}, "gpu": {"count": 2}},
    {"target": {"dtype": "bfloat16"}, "draft": {"dtype": "float32", "quantization": "none"}},
]


@pytest.mark.parametrize("line,variant", list(itertools.product(sorted(VERSIONS), range(len(_VARIANTS)))))
def test_generated_commands_use_only_documented_flags(tmp_path, tiny_pair, line, variant):
    spec = engine_spec(tmp_path, tiny_pair, engine={"trtllm_version": VERSIONS[line]}, **_VARIANTS[variant])
    release = get_release(VERSIONS[line])
    parser = make_parser(VERSIONS[line])
    for role in ("target", "draft"):
        cmd = trtllm_build_command(spec, role, tmp_path / "ckpt", tmp_path / "out")
        flags = [a for a in cmd[1:] if a.startswith("--")]
        assert set(flags) <= release.flag_names, set(flags) - release.flag_names
        ns = parser.parse_args(cmd[1:])  # the same table, as argparse: values and choices parse
        assert ns.use_paged_context_fmha == "enable" and ns.max_beam_width == 1
        assert ns.max_seq_len == spec.engine.max_seq_len and ns.max_input_len == spec.engine.max_input_len
        if role == "target":
            assert ns.speculative_decoding_mode == "draft_tokens_external"
            assert ns.max_draft_len == spec.speculative.max_draft_len
            assert ns.gather_generation_logits is spec.speculative.use_draft_logits  # both engines (run_dtm_pld.py)
        else:
            assert ns.speculative_decoding_mode is None and ns.max_draft_len is None
            assert ns.gather_generation_logits is spec.speculative.use_draft_logits
    target = trtllm_build_command(spec, "target", tmp_path / "c", tmp_path / "o")
    assert ("--use_fp8_context_fmha" in target) == (spec.target.kv_cache.value == "fp8")
    assert ("--workers" in target) == (spec.target.tp_size > 1)


@pytest.mark.parametrize(
    "bad,msg",
    [
        (["--auto_parallel", "2"], "has no flag --auto_parallel"),
        (["--gemm_plugin", "int8"], "has no choice 'int8'"),
        (["--speculative_decoding_mode", "draft_model"], "has no choice 'draft_model'"),
        (["--max_draft_len"], "needs exactly one value"),
        (["--max_draft_len", "four"], "takes an integer"),
        (["--gather_generation_logits=true"], "takes no value"),
        (["--tp_size", "2"], "has no flag --tp_size"),
    ],
)
def test_validate_command_rejects_what_1_2_does_not_document(bad, msg):
    base = ["trtllm-build", "--checkpoint_dir", "c", "--output_dir", "o"]
    validate_command(base, "1.2.0")
    with pytest.raises(EngineBuildError, match=msg):
        validate_command(base + bad, "1.2.0")


def test_the_standin_rejects_unknown_flags_and_choices_like_argparse():
    parser = make_parser("1.2.0")
    for argv in (["--auto_parallel", "2"], ["--kv_cache_type", "ring"], ["--tp_size", "2"]):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(argv)
        assert exc.value.code == 2
    assert make_parser("1.1.0").parse_args(["--auto_parallel", "2"]).auto_parallel == 2


def test_ngc_tags_map_to_trtllm_releases():
    assert ngc_image("1.0.0") == "nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3"
    assert ngc_image("0.20.0") == "nvcr.io/nvidia/tritonserver:25.07-trtllm-python-py3"
    assert ngc_image("1.0.3") == "nvcr.io/nvidia/tritonserver:25.11-trtllm-python-py3"
    assert ngc_image("1.1.0") == "nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3"  # newest that ships it
    assert ngc_image("1.2.0rc8") == "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3"
    assert ngc_image("1.2.1") == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    with pytest.raises(EngineBuildError, match="no NGC tritonserver image"):
        ngc_image("1.2.0")  # 26.03 ships the release candidate, not 1.2.0
    assert image_trtllm_version("nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3") == "0.21.0"
    assert image_trtllm_version("registry.example/trtspec:latest") is None
    with pytest.raises(EngineBuildError, match="tag 24.01"):
        image_trtllm_version("nvcr.io/nvidia/tritonserver:24.01-trtllm-python-py3")
    with pytest.raises(EngineBuildError, match="no NGC tritonserver image"):
        ngc_image("1.0.7")
    with pytest.raises(EngineBuildError, match="not in trtspec's version table"):
        ngc_image("0.19.0")
    for t in NGC_TAGS:
        assert normalize_version(t.trtllm_version) in {normalize_version(v) for v in VERSIONS.values()} | {
            "1.0.3",
            "1.2.0rc8",
            "1.2.1",
        }


def test_versions_normalize_to_the_release():
    assert normalize_version("1.0.3.2510") == "1.0.3"
    assert normalize_version("v1.1.0rc5") == "1.1.0rc5"  # a release candidate is a release of its own
    assert release_line("1.2.0rc8") == "1.2"
    assert normalize_version("1.2") == "1.2.0"
    with pytest.raises(EngineBuildError):
        normalize_version("latest")
