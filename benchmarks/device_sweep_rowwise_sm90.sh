#!/bin/bash
# Follow-up H200 call for the fp8 rowwise batched GEMM (issue 7): the first call's fp8 sweep died
# at M=4096 (graphs replaying freed buffers, fixed in sm90_timing.CapturedGraph) and its baseline
# workload hit CUBLAS_STATUS_NOT_SUPPORTED at M=1 (the loop now pads M to 16). About 150 s.
#   GIT_COMMIT=<sha> bash benchmarks/device_sweep_rowwise_sm90.sh
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/env_and_trace.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv > "$LOG" 2>&1
timeout 45 python3 -m skillrun.profiling.run --out "$OUT/fp8_rowwise_batched_baseline.trace.json.gz" --steps 2:5 -- \
  python3 benchmarks/workloads/fp8_rowwise_batched_workload.py >> "$LOG" 2>&1
python3 benchmarks/trace_top_kernels.py "$OUT"/*.trace.json.gz --top 12 2>&1 | tee -a "$LOG"
timeout 200 python3 benchmarks/bench_fp8_rowwise_batched_sm90.py --sweep --budget-s 170 \
  --out "$OUT/fp8_results.json" 2>&1 | tee "$OUT/fp8_log.txt"
