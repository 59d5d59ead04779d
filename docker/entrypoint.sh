#!/usr/bin/env bash
# build       run every stage of the mounted spec (engines into /engines, repository into /models), then exit
# serve       build (up-to-date stages are skipped), then run tritonserver on the repository
# serve-only  run tritonserver on an already built repository (Kubernetes pods, artifacts mounted read-only)
#             Both serve Triton on 8000/8001/8002 and, unless TRTSPEC_OPENAI_PORT=0, the OpenAI-compatible API on
#             TRTSPEC_OPENAI_PORT (9000): a signal stops both, and either one exiting stops the other.
# link        only link the artifacts to the container paths the repository's configs name
# anything else is executed as given
set -euo pipefail
spec="${TRTSPEC_SPEC:-/spec/trtspec.yaml}"

link_mounts() {
  # The configs name artifacts at fixed container paths (e.g. runtime trtllm-llmapi's model.yaml reads
  # /checkpoints/<role>); where the build wrote them elsewhere in this container, link them there.
  python3 - "${TRTSPEC_SPEC__OUTPUT__REPO_DIR:-/models}/manifest.json" <<'PY'
import json, os, sys
if os.path.isfile(sys.argv[1]):
    for host, inside in json.load(open(sys.argv[1])).get("container_mounts", []):
        if host != inside and not os.path.lexists(inside):
            os.makedirs(os.path.dirname(inside), exist_ok=True)
            os.symlink(host, inside)
PY
}

serve() {
  link_mounts
  local repo="${TRTSPEC_SPEC__OUTPUT__REPO_DIR:-/models}" openai="${TRTSPEC_OPENAI_PORT:-9000}"
  # The repository's launch (trtspec.serving.launch): for two TensorRT-LLM engines upstream's launch_triton_server.py
  # --multi-model (mpirun, --disable-auto-complete-config, per-rank shm prefixes, TRTLLM_ORCHESTRATOR=1 and
  # TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES), plain tritonserver otherwise. Extra arguments go to rank 0.
  # It supervises the launch: SIGTERM drains (TRTSPEC_DRAIN_TIMEOUT s, default 30: new requests refused, in-flight ones
  # finish or get a final error) before the server stops; a dead model stub is reported and its model reloaded
  # (TRTSPEC_STUB_WATCH=0: neither the watch nor rank 0's explicit model control).
  local triton_cmd=(python3 -m trtspec.serving.launch "$repo" "$@")
  if [ "$openai" = "0" ]; then
    exec "${triton_cmd[@]}"
  fi
  "${triton_cmd[@]}" &
  local triton=$!
  # The OpenAI-compatible frontend next to it; it answers /health with 503 until Triton is ready.
  python3 -m trtspec.serving.openai --repo "$repo" --triton 127.0.0.1:8001 --host 0.0.0.0 --port "$openai" &
  local front=$!
  # SIGTERM: the frontend starts its drain (SIGUSR1: new /v1 requests 503 with Retry-After, /health not ready) and
  # Triton drains (the frontend keeps relaying the streams in flight); once Triton has stopped, the frontend stops.
  trap 'kill -USR1 "$front" 2>/dev/null || true; kill -TERM "$triton" 2>/dev/null || true' TERM INT
  local status=0
  wait -n "$triton" "$front" || status=$?
  while kill -0 "$triton" 2>/dev/null; do wait "$triton" 2>/dev/null || true; done
  kill -TERM "$front" 2>/dev/null || true
  wait "$front" 2>/dev/null || true
  exit "$status"
}

case "${1:-serve}" in
  build) trtspec build "$spec" ;;
  serve) shift || true; trtspec build "$spec"; serve "$@" ;;
  serve-only) shift; serve "$@" ;;
  link) link_mounts ;;
  *) exec "$@" ;;
esac
