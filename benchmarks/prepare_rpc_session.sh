#!/usr/bin/env bash
# Build box side of benchmarks/rpc_session.sh: the runtime pack (TVM's runtime with its RPC
# tracker and server, tornado, gemm_ladder) and the candidates of a plan, under build/.
#
#   PY=.venv/bin/python bash benchmarks/prepare_rpc_session.sh [gpu-box-python] [plan]
#       defaults: 3.12, benchmarks/rpc_plan.txt (60 candidates: about 10 minutes of building on 2 cores)
#
# Then carry the repo with build/runtime and build/rpc_tune (git-ignored, about 35 MiB) to the GPU box.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
GPU_PY=${1:-3.12}
PLAN=${2:-benchmarks/rpc_plan.txt}

$PY -m gemm_ladder pack-runtime build/runtime --python "$GPU_PY"
rm -rf build/rpc_tune
# the L2 model of an H200 (132 SMs, 50 MiB L2), whatever GPU this box has
$PY -m gemm_ladder tune --plan "$PLAN" --build-only --out build/rpc_tune --l2-keep 2 --sms 132 --l2-mb 50 2>&1 \
  | grep -v "it/s]"
du -sh build/runtime build/rpc_tune
