"""Runs the build pipeline in a child process (for kill / Ctrl-C tests): SPEC_YAML CHECKPOINTS_JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the root, for the tests package

from tests.engine_helpers import TinyStageBodies  # noqa: E402
from trtspec.pipeline import run_pipeline  # noqa: E402
from trtspec.spec import load_spec  # noqa: E402


def main() -> int:
    spec = load_spec(sys.argv[1], environ={})
    checkpoints = {k: Path(v) for k, v in json.loads(sys.argv[2]).items()}
    try:
        report = run_pipeline(spec, bodies=TinyStageBodies(checkpoints).bodies())
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return 130
    print(json.dumps(report.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
