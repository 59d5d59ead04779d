"""Pack a distilled draft of the embedded example into trtspec/data/draft (what `example_draft()` unpacks).

    trtspec distill --target "$(python -c 'from trtspec.example import example_target; print(example_target())')" \
        --out draft-smollm2 --tokens 400000 --answers-per-prompt 8 --steps 1200 --eval-prompts 32 --threads 2
    python scripts/pack_example_draft.py draft-smollm2

The package keeps the standard checkpoint's config, its non-zero head rows (float16, without the target's embeddings),
the report and the n-gram pool.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtspec.distill.pack import pack_draft  # noqa: E402
from trtspec.example import example_target  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("draft", type=Path, help="output directory of `trtspec distill`")
    parser.add_argument("--out", type=Path, default=ROOT / "trtspec" / "data" / "draft")
    args = parser.parse_args()
    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    pack_draft(args.draft, example_target(), tmp)
    shutil.rmtree(args.out, ignore_errors=True)
    tmp.rename(args.out)
    size = sum(p.stat().st_size for p in args.out.iterdir()) / 2**20
    print(f"packed {args.draft} into {args.out} ({size:.1f} MiB)")


if __name__ == "__main__":
    main()
