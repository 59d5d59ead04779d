"""STAND-IN for TensorRT-LLM's `trtllm-build`, for tests only (TensorRT-LLM cannot be installed here).

It accepts exactly the flags and choices recorded from upstream's build.py and plugin.py for the release line of
``TRTLLM_STANDIN_VERSION`` (tests/upstream/trtllm_build.json, not trtspec's own version table; argparse rejects anything
else with exit code 2, as the real tool does), checks the checkpoint the way the real builder reads
it (config.json with architecture/dtype/mapping/quantization, rank<i>.safetensors), and writes an engine directory
shaped like the real one: config.json {version, pretrained_config, build_config} and rank<i>.engine placeholders.
It computes nothing: tests assert on what trtspec does around it (commands, manifests, resume, guards).

Test knobs (environment): TRTLLM_STANDIN_VERSION (default 1.0.0), TRTLLM_STANDIN_SLEEP (seconds to sleep per rank,
to catch a build mid-way), TRTLLM_STANDIN_FAIL (exit with this code after printing an error to stderr),
TRTLLM_STANDIN_RECORD (append each argv as a JSON line to this file).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root, for the recorded facts in tests.upstream

from tests.upstream.facts import load, trtllm_build_flags  # noqa: E402

SPECULATIVE_MODE_VALUES = load("trtllm_build")["speculative_decoding_mode_values"]["values"]
_TYPES = {"str": str, "int": int}


def make_parser(version: str) -> argparse.ArgumentParser:
    """An argparse parser with exactly upstream's recorded flags for ``version``'s release line."""
    parser = argparse.ArgumentParser(prog="trtllm-build", allow_abbrev=False)
    for flag in trtllm_build_flags(version):
        names = [flag["name"], *flag.get("aliases", [])]
        dest = flag["name"][2:]
        if flag["kind"] == "switch":
            parser.add_argument(*names, dest=dest, action="store_true", default=False)
        elif flag["kind"] == "list":
            parser.add_argument(*names, dest=dest, nargs="+", default=None)
        else:
            parser.add_argument(*names, dest=dest, type=_TYPES[flag["type"]], choices=flag.get("choices"), default=None)
    return parser


def _fail(msg: str, code: int = 1) -> None:
    sys.stderr.write(f"[TRT-LLM] [E] {msg}\n")
    sys.exit(code)


def _read_checkpoint(ckpt: Path) -> dict:
    cfg_path = ckpt / "config.json"
    if not cfg_path.is_file():
        _fail(f"FileNotFoundError: {cfg_path}")
    cfg = json.loads(cfg_path.read_text())
    for key in ("architecture", "dtype", "mapping", "quantization"):
        if key not in cfg:
            _fail(f"KeyError: '{key}' missing from {cfg_path}")
    quant = cfg["quantization"]
    if not isinstance(quant, dict) or "quant_algo" not in quant:
        _fail(f"{cfg_path}: quantization has no quant_algo")
    mapping = cfg["mapping"]
    world = int(mapping.get("world_size", 1))
    if world != int(mapping.get("tp_size", 1)) * int(mapping.get("pp_size", 1)):
        _fail(f"{cfg_path}: world_size {world} != tp_size * pp_size")
    for rank in range(world):
        if not (ckpt / f"rank{rank}.safetensors").is_file():
            _fail(f"FileNotFoundError: {ckpt / f'rank{rank}.safetensors'}")
    return cfg


def main(argv: list[str] | None = None) -> int:
    version = os.environ.get("TRTLLM_STANDIN_VERSION", "1.0.0")
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("TRTLLM_STANDIN_RECORD"):
        with open(os.environ["TRTLLM_STANDIN_RECORD"], "a") as f:
            f.write(json.dumps(argv) + "\n")
    args = make_parser(version).parse_args(argv)  # exits 2 on an unknown flag or choice, like the real tool
    print(f"[TensorRT-LLM] TensorRT-LLM version: {version} (trtspec test stand-in)", flush=True)
    if args.checkpoint_dir is None:
        _fail("--checkpoint_dir is required by this stand-in")
    if args.gather_all_token_logits:
        args.gather_context_logits = args.gather_generation_logits = True
    if args.gather_context_logits and (args.max_draft_len or 0) > 0:
        _fail("RuntimeError: Gather context logits is not support with draft len > 0.")
    if args.max_input_len is not None and args.max_seq_len is not None and args.max_input_len >= args.max_seq_len:
        _fail("max_input_len must be smaller than max_seq_len")
    if os.environ.get("TRTLLM_STANDIN_FAIL"):
        _fail("RuntimeError: simulated build failure (TRTLLM_STANDIN_FAIL)", int(os.environ["TRTLLM_STANDIN_FAIL"]))
    ckpt = _read_checkpoint(Path(args.checkpoint_dir))
    out = Path(args.output_dir or "engine_outputs")
    out.mkdir(parents=True, exist_ok=True)
    world = int(ckpt["mapping"].get("world_size", 1))
    mode = args.speculative_decoding_mode or "none"
    build_config = {
        "max_batch_size": args.max_batch_size,
        "max_input_len": args.max_input_len,
        "max_seq_len": args.max_seq_len,
        "max_beam_width": args.max_beam_width or 1,
        "max_num_tokens": args.max_num_tokens,
        "max_draft_len": args.max_draft_len or 0,
        "speculative_decoding_mode": SPECULATIVE_MODE_VALUES[mode],
        "gather_context_logits": bool(args.gather_context_logits or args.gather_all_token_logits),
        "gather_generation_logits": bool(args.gather_generation_logits or args.gather_all_token_logits),
        "kv_cache_type": (args.kv_cache_type or "paged").upper(),
        "plugin_config": {
            "gemm_plugin": args.gemm_plugin,
            "use_paged_context_fmha": args.use_paged_context_fmha,
            "use_fp8_context_fmha": args.use_fp8_context_fmha,
        },
    }
    pretrained = dict(ckpt)
    if args.logits_dtype:
        pretrained["logits_dtype"] = args.logits_dtype
    for rank in range(world):
        print(f"[TRT-LLM] [I] Building engine for rank {rank} of {world}", flush=True)
        time.sleep(float(os.environ.get("TRTLLM_STANDIN_SLEEP", "0")))
        # Real engines are not byte-reproducible (TensorRT picks tactics by timing): a nonce stands for that.
        (out / f"rank{rank}.engine").write_bytes(
            b"TRTSPEC STAND-IN ENGINE, NOT A TENSORRT PLAN\n" + uuid.uuid4().hex.encode() + b"\n"
        )
    (out / "config.json").write_text(
        json.dumps({"version": version, "pretrained_config": pretrained, "build_config": build_config}, indent=2)
    )
    print("[TRT-LLM] [I] Total time of building all engines: 00:00:00", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
