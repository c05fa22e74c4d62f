#!/usr/bin/env bash
# Tuning over TVM's RPC tracker on one multi-GPU box, runtime-only (what
# benchmarks/prepare_rpc_session.sh built: build/runtime and build/rpc_tune/*):
#
#   1. a tracker and one server on GPU 0: every candidate measured      -> run_1gpu.json
#   2. a tracker and one server per GPU: the same candidates             -> run_all.json
#   3. as 2, with one server killed (SIGKILL, its process group) mid-run -> run_kill.json
#      (serve starts it again; the candidate it held is recorded server-lost, the run goes on)
#   summary.json: candidates per minute of each run, and whether the best config of every shape
#   agrees between 1 and 2 (same knobs, or within 2% in the 1-GPU measurements)
#
#   bash benchmarks/rpc_session.sh          # KILL=0 skips step 3; KEY, BATCH, TIMEOUT as below
#
# Outputs in $OUT (or out/): gpu.txt, session.log, run_1gpu.json, run_all.json, run_kill.json,
# summary.json. Merge back on the build box: python -m gemm_ladder tune --merge run_all.json
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
KEY=${KEY:-h200}
BATCH=${BATCH:-4}
TIMEOUT=${TIMEOUT:-30}  # seconds per candidate in the servers' watched child: a kernel takes milliseconds
KILL=${KILL:-1}
mkdir -p "$OUT" build/rpc_logs
export PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,clocks.mem,power.limit,driver_version --format=csv \
  | tee "$OUT/gpu.txt"
ALL=$(nvidia-smi -L | grep -c "^GPU ")
ALL_GPUS=$(seq -s, 0 $((ALL - 1)))
FOLDERS=$(ls -d build/rpc_tune/*/)
LOG="$OUT/session.log"
echo "$(date -u +%FT%TZ) commit $(git rev-parse HEAD 2>/dev/null || echo unknown); $ALL GPUs; $(echo $FOLDERS | wc -w) folders" | tee "$LOG"

start_servers() {  # GPU list, name: a tracker and its servers in the background, until they have registered
  rm -rf "build/rpc_logs/$2" && mkdir -p "build/rpc_logs/$2"
  python3 -m gemm_ladder serve --key "$KEY" --gpus "$1" --host 127.0.0.1 --log-dir "build/rpc_logs/$2" \
    > "build/rpc_logs/$2/serve.txt" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 300); do grep -q "registered" "build/rpc_logs/$2/serve.txt" && break; sleep 1; done
  tee -a "$LOG" < "build/rpc_logs/$2/serve.txt"
  TRACKER=$(grep -o "^tracker [0-9.]*:[0-9]*" "build/rpc_logs/$2/serve.txt" | cut -d" " -f2)
}
stop_servers() { kill -TERM "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; }
measure() {  # run name
  timeout 420 python3 -m gemm_ladder tune --measure $FOLDERS --tracker "$TRACKER" --key "$KEY" \
    --rpc-batch "$BATCH" --timeout "$TIMEOUT" --run-out "$OUT/$1.json" 2>&1 | grep -v "it/s]" | tee -a "$LOG"
}

start_servers 0 one && measure run_1gpu; stop_servers
start_servers "$ALL_GPUS" all && measure run_all; stop_servers
if [ "$KILL" = 1 ] && [ "$ALL" -gt 1 ]; then
  start_servers "$ALL_GPUS" kill
  measure run_kill &
  MEASURE_PID=$!
  # a third of the way into the run, kill the server of the last GPU with its sessions
  sleep "$(python3 -c "import json; print(max(5, json.load(open('$OUT/run_all.json'))['wall_s'] / 3))")"
  VICTIM=$(grep -o "pid [0-9]*" "build/rpc_logs/kill/server_gpu$((ALL - 1)).log" | head -1 | cut -d" " -f2)
  echo "$(date -u +%FT%TZ) killing the server of GPU $((ALL - 1)) (process group $VICTIM)" | tee -a "$LOG"
  kill -KILL -- "-$VICTIM"
  wait "$MEASURE_PID"
  stop_servers
fi
python3 benchmarks/rpc_compare.py "$OUT"/run_1gpu.json "$OUT"/run_all.json "$OUT"/run_kill.json \
  > "$OUT/summary.json"
tee -a "$LOG" < "$OUT/summary.json"
