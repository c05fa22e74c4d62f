#!/usr/bin/env bash
# Build box side of the GPU session of issue 12 (every shape): a runtime-only TVM, the front door's
# test pack with the v10/v11/runtime-M test cases, the shape suite's kernel pack and the issue's
# kernels beside their baselines, under build/.
#
#   PY=.venv/bin/python bash benchmarks/prepare_front_door.sh [python-version-of-the-GPU-box]   (default 3.12)
#
# Then carry the repo with build/runtime, build/front_cases, build/suite_pack and build/every_shape
# (git-ignored; the last lines print their sizes) to the GPU box and run there:
#   bash benchmarks/gpu_session.sh front    # the GPU tests of the front door, v10/v11, runtime M
#   bash benchmarks/gpu_session.sh suite    # the shape suite against cuBLAS; v10/v11 benched
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
GPU_PY=${1:-3.12}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # benchmarks/every_shape_kernels.py imports this checkout
export GEMM_LADDER_TUNING_DB=${GEMM_LADDER_TUNING_DB:-gemm_ladder/serve/tuning_db.json}  # the packaged one alone

$PY -m gemm_ladder pack-runtime build/runtime --python "$GPU_PY"
rm -rf build/suite_pack build/front_cases build/every_shape
# the GPU tier's modules, into one folder: the front door's pack (front_cases/front_pack) and the
# cases of tests/gpu_cases.py for v10, v11 and the runtime-M modules (front_cases/cases.json);
# the tests themselves skip here
GEMM_LADDER_GPU_EXPORT=build/front_cases $PY -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_front_door_gpu.py tests/test_sm90a_small_m.py tests/test_dynamic_m.py
# every shape of the suite, both dtypes, planned for an H100 (132 SMs): one module per choice of
# the policy, shared by all the M a runtime-M module serves
$PY -m gemm_ladder pack build --suite --dtypes float16,bfloat16 --sms 132 --out build/suite_pack
# v10, v11 and runtime-M v11 with the wave model's knobs, beside v9 (benched by gpu_session.sh suite)
$PY benchmarks/every_shape_kernels.py build/every_shape
$PY -m gemm_ladder pack check build/suite_pack > /dev/null
$PY -m gemm_ladder pack check build/front_cases/front_pack > /dev/null
du -sh build/runtime build/front_cases build/suite_pack build/every_shape
