#!/bin/bash
# The single H200 call for issue 7 (fp8 rowwise batched GEMM + a16wi4 MoE): baseline workload
# traces, then each family's config sweep and side-by-side table. Every step has its own time
# limit so a slow step cannot starve the others; results are written to $OUT as they come.
#   GIT_COMMIT=<sha> bash benchmarks/device_sweep_rowwise_and_moe_sm90.sh
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/env_and_traces.txt"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'cublas', torch.backends.cuda.preferred_blas_library())"
} >> "$LOG" 2>&1

# 1. Baseline traces through the runner's own profile step (torch.profiler, record_shapes, CUDA).
timeout 45 python3 -m skillrun.profiling.run --out "$OUT/fp8_rowwise_batched_baseline.trace.json.gz" --steps 2:5 -- \
  python3 benchmarks/workloads/fp8_rowwise_batched_workload.py >> "$LOG" 2>&1
timeout 45 python3 -m skillrun.profiling.run --out "$OUT/moe_a16wi4_baseline.trace.json.gz" --steps 2:5 -- \
  python3 benchmarks/workloads/moe_a16wi4_workload.py >> "$LOG" 2>&1
python3 benchmarks/trace_top_kernels.py "$OUT"/*.trace.json.gz --top 12 2>&1 | tee -a "$LOG"
ls -la "$OUT" >> "$LOG"

# 2. fp8 rowwise batched GEMM: sweep + table.
timeout 130 python3 benchmarks/bench_fp8_rowwise_batched_sm90.py --sweep --budget-s 100 \
  --out "$OUT/fp8_results.json" 2>&1 | tee "$OUT/fp8_log.txt"

# 3. a16wi4 MoE: per-stage sweep + table (swept combos first, then the others while time lasts).
timeout 175 python3 benchmarks/bench_moe_a16wi4_sm90.py --sweep --budget-s 150 --reps 10 \
  --combos 384x512,64x2048,384x2048,64x512 --out "$OUT/moe_results.json" 2>&1 | tee "$OUT/moe_log.txt"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv >> "$LOG" 2>&1
