#!/usr/bin/env bash
# The main job on the embedded example: write a spec, check it, show the plan, write the Triton repository, serve it
# with a real tritonserver, ask two questions through the ensemble (one grounded in a given passage, one open), each
# target-only and then speculatively (the same server, num_draft_tokens 0 vs the deployment's K), compare the answers
# and latencies with a verdict per question, measure both side by side
# with `trtspec bench`, say plainly whether speculation paid on this machine and why, and stop the server.
set -euo pipefail
work=${TRTSPEC_DEMO_DIR:-demo-out}
open_question=${TRTSPEC_DEMO_QUESTION:-"Why is the sky blue? Answer in two sentences."}
grounded_question=${TRTSPEC_DEMO_GROUNDED:-"Rewrite this passage in plain words, keeping every fact: The Eiffel Tower is a \
wrought-iron lattice tower in Paris, France. It was built from 1887 to 1889 for the World's Fair and is 330 meters tall. \
It was the tallest man-made structure in the world until 1930."}
max_tokens=${TRTSPEC_DEMO_MAX_TOKENS:-64}
mkdir -p "$work"
cd "$work"
step() { printf '\n== %s\n' "$*"; }

step "trtspec init: a commented spec for the embedded example (SmolLM2-135M-Instruct + its distilled draft)"
trtspec init --force -o trtspec.yaml
step "trtspec check: can these two models be paired, and do they fit?"
trtspec check trtspec.yaml
step "trtspec plan: what trtspec build would run"
trtspec plan trtspec.yaml
step "trtspec repo: the Triton model repository"
trtspec repo trtspec.yaml

read -r http grpc metrics < <(python -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
step "trtspec serve: a real tritonserver on gRPC :$grpc, HTTP :$http (log: $work/tritonserver.log)"
trtspec serve triton_repo --http-port "$http" --grpc-port "$grpc" --metrics-port "$metrics" \
    --log-file tritonserver.log > serve.out 2>&1 &
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
        sys.exit("trtspec serve exited; see demo-out/serve.out and demo-out/tritonserver.log")
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status == 200:
            print("ready")
            sys.exit(0)
    except OSError:
        pass
    time.sleep(1)
sys.exit("tritonserver was not ready within 300 s; see demo-out/tritonserver.log")
PY

step "two questions, each target only (num_draft_tokens 0), then speculative (the deployment's K, adaptive per step)"
# Each path once first, unmeasured: a first request pays one-time costs (and both then find the prompt's KV cached).
for mode in --no-draft ""; do trtspec generate "$open_question" --url "127.0.0.1:$grpc" -n 4 $mode --json > /dev/null; done
ask() {  # name, question: target-only then speculative, then the verdict for this question
    trtspec generate "$2" --url "127.0.0.1:$grpc" -n "$max_tokens" --no-draft --json > "$1.target_only.json"
    trtspec generate "$2" --url "127.0.0.1:$grpc" -n "$max_tokens" --json > "$1.speculative.json"
    python - "$1" "$1.target_only.json" "$1.speculative.json" <<'PY'
import json, sys
name = sys.argv[1]
base, spec = (json.load(open(p)) for p in sys.argv[2:4])
print(f"-- {name} question")
for label, r in (("target only", base), ("speculative", spec)):
    s = r["stats"]
    extra = ""
    if label == "speculative" and "acceptance_rate" in s:
        extra = f", acceptance {s['acceptance_rate']:.2f}"
    print(f"{label:>12}: {r['text'].strip()!r}")
    print(f"{'':>12}  {s.get('num_output_tokens', '?')} tokens in {r['latency_s']:.2f} s{extra}")
same = base["text"] == spec["text"]
print(f"same answer: {'yes' if same else 'NO'} (greedy speculative decoding must give the target's own text)")
ratio = base["latency_s"] / spec["latency_s"]
verdict = "faster" if ratio >= 1.05 else "no measurable difference" if ratio > 1 / 1.05 else "slower"
print(f"verdict ({name}): speculative {ratio:.2f}x the target-only speed: {verdict}")
sys.exit(0 if same else 1)
PY
}
ask grounded "$grounded_question"
ask open "$open_question"

step "trtspec bench: the built-in prompts, target-only and speculative, one at a time, side by side"
trtspec bench --url "127.0.0.1:$grpc" -c 1 --requests 6 -n "$max_tokens"
