"""Quantization format table, guards and calibration data: no calibration runs here, so these are fast."""

from __future__ import annotations

import json

import pytest

from trtspec.build import formats
from trtspec.build.calibration import Document, is_heldout, read_documents, shipped_corpus, tokenize_calibration
from trtspec.build.formats import KVCacheFormat, Quantization
from trtspec.errors import QuantizationError

SMOLLM2_LIKE = [
    ("model.layers.0.self_attn.q_proj", 576),
    ("model.layers.0.self_attn.o_proj", 576),
    ("model.layers.0.mlp.down_proj", 1536),
]


def test_every_spec_format_maps_to_modelopt_and_trtllm():
    assert set(formats.FORMATS) == set(Quantization)
    for q, fmt in formats.FORMATS.items():
        assert (fmt.modelopt_cfg is None) == (q is Quantization.NONE)
        assert (fmt.trtllm_algo is None) == (q is Quantization.NONE)
    # QuantAlgo names TensorRT-LLM accepts in a checkpoint (tensorrt_llm/quantization/mode.py QuantAlgo)
    assert {f.trtllm_algo for f in formats.FORMATS.values()} - {None} <= {
        "FP8",
        "W8A8_SQ_PER_CHANNEL",
        "W4A16_AWQ",
        "W4A8_AWQ",
        "W8A16",
        "NVFP4",
    }


def test_modelopt_config_appends_the_kv_cache_quantizers_to_a_copy():
    import modelopt.torch.quantization as mtq

    cfg = formats.modelopt_config(Quantization.FP8, KVCacheFormat.FP8)
    assert cfg["quant_cfg"][-1] == {"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3), "axis": None}}
    assert len(mtq.FP8_DEFAULT_CFG["quant_cfg"]) == len(cfg["quant_cfg"]) - 1  # the preset itself is untouched
    assert formats.modelopt_config(Quantization.INT4_AWQ, KVCacheFormat.AUTO)["algorithm"]["method"] == "awq_lite"


def test_int4_on_hidden_576_names_the_layer_the_dimension_and_the_formats_that_work():
    with pytest.raises(QuantizationError) as err:
        formats.check_block_size(Quantization.INT4_AWQ, SMOLLM2_LIKE, cuda_available=False)
    assert "model.layers.0.self_attn.q_proj" in err.value.message and "576" in err.value.message
    assert "blocks of 128" in err.value.message
    assert err.value.hint == "formats that work for this model here: fp8, int8_sq, int8_wo"
    formats.check_block_size(Quantization.FP8, SMOLLM2_LIKE, cuda_available=False)  # no blocks: fine
    assert "nvfp4" in formats.formats_that_fit(SMOLLM2_LIKE, cuda_available=True)  # 576 = 36 x 16


def test_nvfp4_is_refused_on_a_machine_without_cuda_before_any_work():
    with pytest.raises(QuantizationError) as err:
        formats.check_machine(Quantization.NVFP4, KVCacheFormat.AUTO, cuda_available=False, hf_export=True)
    assert "CUDA" in err.value.message and "int4_awq" in err.value.hint
    formats.check_machine(Quantization.NVFP4, KVCacheFormat.AUTO, cuda_available=True, hf_export=True)


def test_int8_kv_cache_is_refused_for_the_unified_hf_export_only():
    with pytest.raises(QuantizationError, match="INT8 KV"):
        formats.check_machine(Quantization.FP8, KVCacheFormat.INT8, cuda_available=False, hf_export=True)
    formats.check_machine(Quantization.FP8, KVCacheFormat.INT8, cuda_available=False, hf_export=False)


def test_fp8_warns_below_compute_capability_8_9():
    warn = formats.fp8_capability_warning(Quantization.FP8, KVCacheFormat.AUTO, [("this GPU (A100)", (8, 0))])
    assert warn is not None and "8.9" in warn and "8.0" in warn
    assert formats.fp8_capability_warning(Quantization.FP8, KVCacheFormat.AUTO, [("H200", (9, 0))]) is None
    assert formats.fp8_capability_warning(Quantization.INT8_WO, KVCacheFormat.FP8, [("A100", (8, 0))]) is not None
    assert formats.fp8_capability_warning(Quantization.INT4_AWQ, KVCacheFormat.AUTO, [("A100", (8, 0))]) is None
    assert formats.parse_capability("9.0") == (9, 0) and formats.parse_capability("x") is None


# -- calibration data ---------------------------------------------------------------------------------------------
def test_shipped_corpus_is_a_few_hundred_kb_of_prose_code_and_dialogue_with_its_license():
    path = shipped_corpus()
    docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    sizes: dict[str, int] = {}
    for d in docs:
        sizes[d["kind"]] = sizes.get(d["kind"], 0) + len(d["text"])
    assert 250_000 < sum(sizes.values()) < 1_000_000
    assert set(sizes) == {"prose", "code", "dialogue"} and min(sizes.values()) > 40_000
    assert (path.parent / "README.md").is_file() and (path.parent / "LICENSE-PSF.txt").is_file()


@pytest.mark.parametrize(
    "content, suffix, message",
    [
        (None, ".txt", "calibration file not found"),
        ("", ".txt", "no calibration text"),
        ("  \n\n ", ".jsonl", "no calibration text"),
        ('{"text": "a"}\nnot json\n', ".jsonl", ":2: not valid JSON"),
        ('{"prompt": "a"}\n', ".jsonl", ":1: no field 'text' (fields: prompt)"),
        ('{"text": 3}\n', ".jsonl", "field 'text' is int, not text"),
        ('["a"]\n', ".jsonl", "expected a JSON object"),
    ],
)
def test_bad_calibration_files_are_one_clear_error(tmp_path, content, suffix, message):
    path = tmp_path / f"calib{suffix}"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(QuantizationError) as err:
        read_documents(path, "text")
    assert message in err.value.message and err.value.hint


def test_text_files_split_into_paragraphs_and_jsonl_reads_the_named_field(tmp_path):
    (tmp_path / "a.txt").write_text("first para\nline two\n\nsecond\n\n\n", encoding="utf-8")
    assert [d.text for d in read_documents(tmp_path / "a.txt")] == ["first para\nline two\n", "second\n"]
    (tmp_path / "b.jsonl").write_text('{"q": "x", "body": "hello"}\n\n{"body": "world"}\n', encoding="utf-8")
    assert [d.text for d in read_documents(tmp_path / "b.jsonl", "body")] == ["hello", "world"]


def test_heldout_text_never_reaches_calibration(tiny_tokenizer):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer)
    docs = [Document(f"document number {i}: " + "words " * (i % 7 + 3)) for i in range(200)]
    data = tokenize_calibration(docs, tok, samples=8, seq_len=16, source="test")
    held = [d for d in docs if is_heldout(d)]
    assert 5 < len(held) < 40 and data.summary["heldout_documents"] == len(held)
    assert data.calib.shape == (8, 16) and data.heldout.shape[1] == 16
    calib_text = tok.decode(data.calib.flatten().tolist())
    assert not any(d.text in calib_text for d in held)


def test_a_short_file_still_gets_heldout_text_and_one_shorter_chunk(tiny_tokenizer):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer)
    data = tokenize_calibration([Document("just a few words here")], tok, samples=4, seq_len=512, source="t")
    assert data.calib.shape[0] == 1 and 2 <= data.calib.shape[1] < 512 and data.summary["samples"] == 1
    long = [Document("the quick brown fox " * 200)]
    data = tokenize_calibration(long, tok, samples=4, seq_len=64, source="t")
    assert data.heldout.shape[0] >= 1 and data.calib.shape == (4, 64)


def test_torch_runtime_refuses_formats_it_cannot_run_even_on_a_gpu(tiny_pair, tmp_path):
    from trtspec.build.ptq import preflight
    from trtspec.spec import spec_from_dict

    spec = spec_from_dict(
        {
            "runtime": "torch",
            "target": {"model": str(tiny_pair[0]), "quantization": "nvfp4"},
            "draft": {"model": str(tiny_pair[1])},
        },
        base_dir=tmp_path,
        environ={},
    )
    with pytest.raises(QuantizationError, match="torch runtime cannot run nvfp4") as err:
        preflight(spec, "target", cuda=True)
    assert "trtllm-llmapi" in err.value.hint
