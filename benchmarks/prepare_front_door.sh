#!/usr/bin/env bash
# Build box side of the front door's GPU session (issue 12): a runtime-only TVM, the shape suite's
# kernel pack and the front-door test tier's pack, under build/.
#
#   PY=.venv/bin/python bash benchmarks/prepare_front_door.sh [python-version-of-the-GPU-box]   (default 3.12)
#
# Then carry the repo with build/runtime, build/suite_pack and build/front_cases (git-ignored,
# about 30 MiB together) to the GPU box and run there:
#   bash benchmarks/gpu_session.sh front    # the front door's GPU tests, from build/front_cases
#   bash benchmarks/gpu_session.sh suite    # the shape suite against cuBLAS, from build/suite_pack
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
GPU_PY=${1:-3.12}
export GEMM_LADDER_TUNING_DB=${GEMM_LADDER_TUNING_DB:-benchmarks/tuning/tuning_db.json}

$PY -m gemm_ladder pack-runtime build/runtime --python "$GPU_PY"
rm -rf build/suite_pack build/front_cases
# every shape of the suite, both dtypes, planned for an H100 (132 SMs): one module per choice of
# the policy, shared by all the M a runtime-M module serves
$PY -m gemm_ladder pack build --suite --dtypes float16,bfloat16 --sms 132 --out build/suite_pack
# the front-door GPU tier's pack (tests/test_front_door_gpu.py exports it and skips its tests here)
GEMM_LADDER_GPU_EXPORT=build/front_cases $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_front_door_gpu.py
$PY -m gemm_ladder pack check build/suite_pack > /dev/null
$PY -m gemm_ladder pack check build/front_cases/front_pack > /dev/null
du -sh build/runtime build/suite_pack build/front_cases
