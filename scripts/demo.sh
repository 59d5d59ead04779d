#!/usr/bin/env bash
# The main job on the embedded example: write a spec, check it, show the plan.
set -euo pipefail
work=${TRTSPEC_DEMO_DIR:-demo-out}
mkdir -p "$work"
cd "$work"
trtspec init --force -o trtspec.yaml
trtspec check trtspec.yaml
trtspec plan trtspec.yaml
