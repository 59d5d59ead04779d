"""Time and peak memory (RSS) of `trtspec quantize` on the SmolLM2-135M target, one process per format.

    python benchmarks/quantize_smollm2.py [--samples 32 --seq-len 256] [--proxy]

Each format runs in a fresh process (so its peak RSS is its own) through the real stage body (quantize_into: guards,
calibration on the shipped corpus, quality evaluation, export). A baseline process only loads the model and runs the
held-out evaluation once, for the RSS ratio. SmolLM2's hidden size 576 is not a multiple of the 4-bit block size 128,
so int4_awq and w4a8_awq are refused there (the time shown is the time to refuse); ``--proxy`` adds a random Llama of
the same depth and vocabulary with hidden 640 (170M parameters), where the AWQ formats can run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FORMATS = ["fp8", "int8_sq", "int8_wo", "int4_awq", "w4a8_awq"]


def _spec(model: Path, fmt: str, samples: int, seq_len: int, base: Path):
    from trtspec.spec import spec_from_dict

    return spec_from_dict(
        {
            "runtime": "torch",
            "target": {"model": str(model), "dtype": "float32", "quantization": fmt},
            "draft": {"model": str(model), "dtype": "float32", "quantization": "none"},
            "calibration": {"samples": samples, "seq_len": seq_len, "batch_size": 4},
        },
        base_dir=base,
        environ={},
    )


def one(model: Path, fmt: str, samples: int, seq_len: int) -> dict:
    """Run in the child process: one format, or the baseline (load + held-out evaluation)."""
    from trtspec.errors import TrtspecError

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        if fmt == "baseline":
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from trtspec.build.calibration import load_calibration
            from trtspec.build.quality import evaluate

            spec = _spec(model, "fp8", samples, seq_len, Path(tmp))
            data = load_calibration(spec, AutoTokenizer.from_pretrained(model))
            m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
            evaluate(m, data.heldout, 4)
            result = {"status": "ok", "timings": {}}
        else:
            from trtspec.build.quantize import quantize_into

            out = Path(tmp) / "out"
            out.mkdir()
            try:
                fields = quantize_into(_spec(model, fmt, samples, seq_len, Path(tmp)), "target", out)
                result = {"status": "ok", "timings": fields["timings"], "quality": fields["quality"]}
            except TrtspecError as exc:
                result = {"status": f"refused: {exc.message[:70]}...", "timings": {}}
    result["wall_s"] = time.monotonic() - t0
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def make_proxy(out: Path) -> Path:
    """A random Llama shaped like SmolLM2-135M but with hidden 640 / intermediate 1664 (multiples of 128)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from trtspec.example import example_target

    src = example_target()
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=640,
        intermediate_size=1664,
        num_hidden_layers=30,
        num_attention_heads=10,
        num_key_value_heads=5,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--proxy", action="store_true", help="also run the AWQ formats on a hidden-640 proxy")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(Path(args.model), args.one, args.samples, args.seq_len)))
        return

    from trtspec.example import example_target

    models = [("SmolLM2-135M", example_target(), ["baseline", *FORMATS])]
    tmp = tempfile.TemporaryDirectory()
    if args.proxy:
        models.append(
            ("proxy hidden 640", make_proxy(Path(tmp.name) / "proxy"), ["baseline", "fp8", "int4_awq", "w4a8_awq"])
        )
    print(
        f"calibration: {args.samples} samples x {args.seq_len} tokens, batch 4; shipped corpus; CPU "
        f"(2 cores shared); each row one process"
    )
    print(
        f"{'model':18} {'format':9} {'status':10} {'wall s':>7} {'calib s':>8} {'export s':>8} {'RSS MiB':>8} "
        f"{'RSS/base':>8} {'time/fp8':>8} {'top-1':>6} {'ppl %':>6}"
    )
    for name, path, formats in models:
        rows = {}
        for fmt in formats:
            cmd = [
                sys.executable,
                __file__,
                "--one",
                fmt,
                "--model",
                str(path),
                "--samples",
                str(args.samples),
                "--seq-len",
                str(args.seq_len),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
                rows[fmt] = {
                    "status": f"crashed: {last[:60]}",
                    "timings": {},
                    "wall_s": float("nan"),
                    "peak_rss_mib": float("nan"),
                }
            else:
                rows[fmt] = json.loads(proc.stdout.strip().splitlines()[-1])
            r = rows[fmt]
            base, fp8 = rows.get("baseline"), rows.get("fp8")
            q = r.get("quality") or {}
            print(
                f"{name:18} {fmt:9} {r['status'][:10]:10} {r['wall_s']:7.1f} "
                f"{r['timings'].get('calibrate_s', float('nan')):8.1f} "
                f"{r['timings'].get('export_s', float('nan')):8.1f} "
                f"{r['peak_rss_mib']:8.0f} "
                f"{r['peak_rss_mib'] / base['peak_rss_mib'] if base else float('nan'):8.2f} "
                f"{r['wall_s'] / fp8['wall_s'] if fp8 and fp8['status'] == 'ok' else float('nan'):8.2f} "
                f"{q.get('top1_agreement', float('nan')):6.3f} {q.get('perplexity_change_pct', float('nan')):+6.1f}",
                flush=True,
            )
            if r["status"] != "ok" and not r["status"].startswith("refused"):
                print(f"    {r['status']}")
            elif r["status"].startswith("refused"):
                print(f"    {r['status']}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
