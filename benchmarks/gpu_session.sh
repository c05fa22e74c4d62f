#!/usr/bin/env bash
# One GPU session, runtime-only: what the build box prepared (see benchmarks/README.md) is
# checked and timed here with nothing but the TVM runtime pack, torch and the C++ runner.
#
#   bash benchmarks/gpu_session.sh tests    # the GPU test tier over the prebuilt cases
#   bash benchmarks/gpu_session.sh bench    # bench the ladder, run the C++ runner
#   bash benchmarks/gpu_session.sh tune     # measure prepared tuning candidates
#   bash benchmarks/gpu_session.sh sanitize # compute-sanitizer memcheck, racecheck, synccheck
#   bash benchmarks/gpu_session.sh sanitize_grouped  # the same over v12's grouped checks, both layouts (build/grouped)
#   bash benchmarks/gpu_session.sh barriers # broken variants under the watchdog; its cost off/on
#   bash benchmarks/gpu_session.sh front    # the front door's GPU tier (benchmarks/prepare_front_door.sh)
#   bash benchmarks/gpu_session.sh suite    # the shape suite: gemm_ladder.matmul against cuBLAS
#   bash benchmarks/gpu_session.sh smoke    # every GPU-only command on one tiny shape (tests/gpu_smoke.py)
#   bash benchmarks/gpu_session.sh models   # issue 30: m_range_check and the every-model samples (build/em_s*)
#
# Inputs under build/, made by benchmarks/prepare_gpu_session.sh (git-ignored, carried to the GPU box):
# runtime/ (pack-runtime),
# gpu_cases/ (GEMM_LADDER_GPU_EXPORT, with watchdog/ twins), ladder/ (export), runner/ (cmake),
# tune_*/ (tune --build-only), barriers/ (benchmarks/barrier_watchdog.py prepare);
# by benchmarks/prepare_front_door.sh: front_cases/, shape_cases/ (GEMM_LADDER_GPU_EXPORT),
# suite_pack/ (pack build --suite), every_shape/ (benchmarks/every_shape_kernels.py);
# by python -m tests.gpu_smoke build/smoke: smoke/.
# Outputs go to $OUT (or out/).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
# the checkout first: the runtime pack's site also holds the gemm_ladder of the day it was packed, and
# ahead of the checkout it would run that instead of the code under test (TVM and tvm_ffi come from it)
export PYTHONPATH=$PWD:$PWD/build/runtime/site TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit,driver_version --format=csv | tee "$OUT/gpu.txt"
# the front door's C++ call lookup (gemm_ladder.serve.native), built before any timed call so every
# process loads it at its first remembered call; tests opt in through this variable (tests/conftest.py)
python3 -m gemm_ladder native 2>&1 | tee "$OUT/native.txt"
export GEMM_LADDER_NATIVE=${GEMM_LADDER_NATIVE:-auto}
case "${1:-bench}" in
  tests)
    GEMM_LADDER_PREBUILT=build/gpu_cases python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_foundation.py tests/test_sm90a_v1_v3.py tests/test_sm90a_v5_v6.py tests/test_barriers.py \
      2>&1 | tee "$OUT/gpu_tests.txt" | grep -v "it/s]"
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
    # every module under build/sanitize/, once per tool, over the whole check (our kernel and
    # torch's reference); one log per module and tool, then one archive of the logs
    for so in build/sanitize/*.so; do
      for tool in memcheck racecheck synccheck; do
        log="$OUT/sanitize_$(basename "$so" .so)_$tool.txt"
        timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 -m gemm_ladder.measure.isolate check "$so" --args 0 > "$log" 2>&1
        rc=$?
        echo "$(basename "$so") $tool: exit $rc; $(grep -h "SUMMARY\|Internal Sanitizer\|GEMM_LADDER_RESULT" "$log" | cut -c1-160 | tr '\n' ' ')"
      done
    done | tee "$OUT/sanitize_summary.txt"
    tar czf "$OUT/sanitize_logs.tgz" -C "$OUT" $(cd "$OUT" && ls sanitize_*_*.txt) && rm -f "$OUT"/sanitize_*_*check.txt
    ;;
  sanitize_grouped)
    # v12 (grouped GEMM) under compute-sanitizer: grouped_check's check job (every routing case, the
    # front door, the op, a CUDA graph replayed after offs changed) on the odd and the Qwen-MoE modules;
    # the masked layout's check job (counts clamped, rows past them poisoned) on the odd masked module
    for pair in grouped_odd_float16.so:check_job grouped_qwen_moe_bfloat16.so:check_job \
                grouped_odd_float16_masked.so:masked_check_job; do
      so="build/grouped/${pair%%:*}"; job="${pair##*:}"
      for tool in memcheck racecheck synccheck; do
        log="$OUT/sanitize_$(basename "$so" .so)_$tool.txt"
        timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 -m gemm_ladder.measure.isolate "benchmarks.grouped_check:$job" "$so" > "$log" 2>&1
        echo "$(basename "$so") $tool: exit $?; $(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|GEMM_LADDER_RESULT" "$log" | cut -c1-160 | tr '\n' ' ')"
      done
    done | tee "$OUT/sanitize_summary.txt"
    ;;
  barriers)
    python3 benchmarks/barrier_watchdog.py run build/barriers --out "$OUT/barriers" 2>&1 | grep -v "it/s]"
    ;;
  front)
    # the front door's tier (its pack: build/front_cases/front_pack) and the issue's kernels:
    # v10/v11 at odd shapes, runtime-M modules at every M of harness.DYNAMIC_M_CHECKS
    GEMM_LADDER_PREBUILT=build/front_cases python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
      tests/test_front_door_gpu.py tests/test_sm90a_small_m.py tests/test_dynamic_m.py \
      2>&1 | tee "$OUT/front_door_tests.txt" | grep -v "it/s]"
    ;;
  suite)
    # kernels from the pack only (nothing is built here); JSON (and the plot, where matplotlib is)
    GEMM_LADDER_BUILD=0 python3 -m gemm_ladder suite run --pack build/suite_pack --out "$OUT/shape_suite.json" \
      2>&1 | grep -v "it/s]" | tee "$OUT/shape_suite.txt"
    # v10, v11 and runtime-M modules with the wave model's knobs, beside v9 (benchmarks/every_shape_kernels.py)
    python3 -m gemm_ladder bench build/every_shape --out "$OUT/bench_every_shape.json" 2>&1 \
      | grep -v "it/s]" | tee "$OUT/bench_every_shape.txt"
    ;;
  smoke)
    # run after any change to host code that runs on a GPU; its log is what a closing note cites
    GEMM_LADDER_SMOKE=build/smoke python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/test_gpu_smoke.py \
      2>&1 | tee "$OUT/gpu_smoke.txt" | grep -v "it/s]"
    ;;
  models)
    # issue 30: any M of a packed weight (benchmarks/m_range_check.py prepare build/m_range), then the
    # every-model suite for each sample packed under build/em_s<SEED>/ (every_model pack build/em_sS --seed S),
    # kernels from the packs only; the front door's first-use choices in a fresh file
    export GEMM_LADDER_BUILD=0 GEMM_LADDER_CHOICES="$OUT/choices.json"
    [ -d build/m_range ] && python3 benchmarks/m_range_check.py run build/m_range --out "$OUT/m_range_check.json" \
      2>&1 | grep -v "it/s]" | tail -40 | tee "$OUT/m_range_check.txt"
    for d in build/em_s*; do
      seed=${d##*_s}
      GEMM_LADDER_PACK=$d/float16:$d/bfloat16 python3 -m gemm_ladder.measure.every_model run --seed "$seed" \
        --out "$OUT/every_model_seed$seed.json" 2>&1 | grep -v "it/s]" | tail -60 | tee "$OUT/every_model_seed$seed.txt"
    done
    ;;
  tune)
    for d in build/tune_*; do
      python3 -m gemm_ladder tune --measure "$d" --measurements-out "$OUT/$(basename "$d")_measurements.json" 2>&1 | grep -v "it/s]"
    done
    ;;
esac
