#!/usr/bin/env bash
# build       run every stage of the mounted spec (engines into /engines, repository into /models), then exit
# serve       build (up-to-date stages are skipped), then run tritonserver on the repository
# serve-only  run tritonserver on an already built repository (Kubernetes pods, artifacts mounted read-only)
# anything else is executed as given
set -euo pipefail
spec="${TRTSPEC_SPEC:-/spec/trtspec.yaml}"

serve() {
  # One Triton process drives both engines (orchestrator mode, TRTLLM_ORCHESTRATOR=1 from the image).
  exec tritonserver --model-repository="${TRTSPEC_SPEC__OUTPUT__REPO_DIR:-/models}" \
    --http-port=8000 --grpc-port=8001 --metrics-port=8002 "$@"
}

case "${1:-serve}" in
  build) trtspec build "$spec" ;;
  serve) shift || true; trtspec build "$spec"; serve "$@" ;;
  serve-only) shift; serve "$@" ;;
  *) exec "$@" ;;
esac
