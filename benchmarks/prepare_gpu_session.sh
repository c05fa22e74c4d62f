#!/usr/bin/env bash
# Build box side of a GPU session: everything benchmarks/gpu_session.sh needs, under build/.
#
#   bash benchmarks/prepare_gpu_session.sh [python-version-of-the-GPU-box]   (default 3.12)
#
# Then carry build/ (git-ignored, < 64 MiB) with the repo to the GPU box and run
# benchmarks/gpu_session.sh there. Set PY to the interpreter that has gemm-ladder installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
GPU_PY=${1:-3.12}
TUNE_SPACE_V5="blk_m=128,256;blk_n=128,192,256;num_warpgroups=2;pipe_depth=2,3,4,5"
TUNE_SPACE_V6="$TUNE_SPACE_V5;tile_order=grouped,snake"

$PY -m gemm_ladder pack-runtime build/runtime --python "$GPU_PY"
rm -rf build/gpu_cases build/ladder build/tune_*
# the GPU test tier's modules (tests/gpu_cases.py; test_barriers.py adds the broken variants)
GEMM_LADDER_GPU_EXPORT=build/gpu_cases $PY -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_foundation.py tests/test_sm90a_v1_v3.py tests/test_sm90a_v5_v6.py tests/test_barriers.py
# their watchdog twins: a case that times out on the GPU box is explained by its twin
$PY -m gemm_ladder.barriers twins build/gpu_cases >/dev/null
# barrier safety on the GPU: broken variants under the watchdog, the watchdog's cost
rm -rf build/barriers
$PY benchmarks/barrier_watchdog.py prepare build/barriers
# the ladder at the benchmark shapes (v1 and v2 take one tile: their largest shapes)
$PY -m gemm_ladder export --rungs v3,v4,v5,v6 --out build/ladder
$PY -m gemm_ladder export --rungs v1 --shapes 128x128x64 --out build/ladder/one_tile
$PY -m gemm_ladder export --rungs v2 --shapes 128x128x8192 --out build/ladder/one_tile
# the C++ runner
cmake -S . -B build/runner -DPython3_EXECUTABLE="$(command -v $PY)" >/dev/null && cmake --build build/runner -j 2 >/dev/null
# tuning candidates for v5 and v6 (measured there with tune --measure, merged here with tune --merge)
for shape in 4096x4096x4096 8192x8192x8192; do
  $PY -m gemm_ladder tune --rung v5 --shape $shape --space "$TUNE_SPACE_V5" --build-only --out build/tune_v5_$shape
  $PY -m gemm_ladder tune --rung v6 --shape $shape --space "$TUNE_SPACE_V6" --l2-keep 2 --sms 132 --l2-mb 50 \
    --build-only --out build/tune_v6_$shape
done
du -sh build
