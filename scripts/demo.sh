#!/usr/bin/env bash
# The main job on the embedded example: write a spec, check it, show the plan, write the Triton repository, serve it
# with a real tritonserver, ask one question through the ensemble, print the answer and the acceptance statistics,
# and stop the server.
set -euo pipefail
work=${TRTSPEC_DEMO_DIR:-demo-out}
mkdir -p "$work"
cd "$work"
trtspec init --force -o trtspec.yaml
trtspec check trtspec.yaml
trtspec plan trtspec.yaml
trtspec repo trtspec.yaml

read -r http grpc metrics < <(python -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
trtspec serve triton_repo --http-port "$http" --grpc-port "$grpc" --metrics-port "$metrics" \
    --log-file tritonserver.log &
server=$!
trap 'kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
python - "$http" "$server" <<'PY'
import sys, time, urllib.request, os
port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 300
while time.time() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("trtspec serve exited; see demo-out/tritonserver.log")
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(1)
sys.exit("tritonserver was not ready within 300 s; see demo-out/tritonserver.log")
PY
trtspec generate "What is the capital of France? Answer in one sentence." --url "127.0.0.1:$grpc" --max-tokens 48
