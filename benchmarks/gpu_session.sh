#!/usr/bin/env bash
# One GPU session, runtime-only: what the build box prepared (see benchmarks/README.md) is
# checked and timed here with nothing but the TVM runtime pack, torch and the C++ runner.
#
#   bash benchmarks/gpu_session.sh tests    # the GPU test tier over the prebuilt cases
#   bash benchmarks/gpu_session.sh bench    # bench the ladder, run the C++ runner
#   bash benchmarks/gpu_session.sh tune     # measure prepared tuning candidates
#   bash benchmarks/gpu_session.sh sanitize # compute-sanitizer memcheck, racecheck, synccheck
#   bash benchmarks/gpu_session.sh front    # the front door's GPU tier (benchmarks/prepare_front_door.sh)
#   bash benchmarks/gpu_session.sh suite    # the shape suite: gemm_ladder.matmul against cuBLAS
#
# Inputs under build/, made by benchmarks/prepare_gpu_session.sh (git-ignored, carried to the GPU box):
# runtime/ (pack-runtime),
# gpu_cases/ (GEMM_LADDER_GPU_EXPORT), ladder/ (export), runner/ (cmake), tune_*/ (tune --build-only),
# front_cases/ and suite_pack/ (benchmarks/prepare_front_door.sh).
# Outputs go to $OUT (or out/).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/build/runtime/site:$PWD TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit,driver_version --format=csv | tee "$OUT/gpu.txt"
case "${1:-bench}" in
  tests)
    GEMM_LADDER_PREBUILT=build/gpu_cases python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_foundation.py tests/test_sm90a_v1_v3.py tests/test_sm90a_v5_v6.py 2>&1 | tee "$OUT/gpu_tests.txt" | grep -v "it/s]"
    ;;
  bench)
    CUDART_DIR=$(python3 -c "import os, nvidia; print(os.path.join(nvidia.__path__[0], 'cu13', 'lib'))" 2>/dev/null || true)
    python3 -m gemm_ladder bench build/ladder build/ladder/one_tile --out "$OUT/bench_ladder.json" 2>&1 | grep -v "it/s]"
    for so in build/ladder/v*_8192x8192x8192_float16_*.so; do
      LD_LIBRARY_PATH=$PWD/build/runtime/site/tvm/lib:$PWD/build/runtime/site/tvm_ffi/lib:$CUDART_DIR \
        build/runner/gemm_runner "$so" --reps 20
    done 2>&1 | tee "$OUT/runner.txt"
    ;;
  sanitize)
    # every module under build/sanitize/, once per tool, only our kernel instrumented (the
    # reference matmul of the check is torch's and is left alone); one log per module and tool
    for so in build/sanitize/*.so; do
      for tool in memcheck racecheck synccheck; do
        log="$OUT/sanitize_$(basename "$so" .so)_$tool.txt"
        timeout 300 compute-sanitizer --tool "$tool" --kernel-name kns=hgemm_kernel --error-exitcode 9 \
          python3 -m gemm_ladder.isolate check "$so" --args 0 > "$log" 2>&1
        echo "$(basename "$so") $tool: exit $? ($(grep -c "ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards" "$log") clean summaries)"
      done
    done | tee "$OUT/sanitize_summary.txt"
    ;;
  front)
    GEMM_LADDER_PREBUILT=build/front_cases python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_front_door_gpu.py 2>&1 | tee "$OUT/front_door_tests.txt" | grep -v "it/s]"
    ;;
  suite)
    # kernels from the pack only (nothing is built here); JSON (and the plot, where matplotlib is)
    GEMM_LADDER_BUILD=0 python3 -m gemm_ladder suite run --pack build/suite_pack --out "$OUT/shape_suite.json" \
      2>&1 | grep -v "it/s]" | tee "$OUT/shape_suite.txt"
    ;;
  tune)
    for d in build/tune_*; do
      python3 -m gemm_ladder tune --measure "$d" --measurements-out "$OUT/$(basename "$d")_measurements.json" 2>&1 | grep -v "it/s]"
    done
    ;;
esac
