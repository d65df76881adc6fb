#!/bin/bash
# The runner, end to end, on the lent H200 (device tool):
#   1. profile the block-scale baseline workload with `skill-run profile` (torch.profiler hook) ->
#      the bundled example trace;
#   2. `skill-run --profile <trace> --run`: match the sm_90 block-scale card, select recipes by shape,
#      run port vs cuBLAS (+ oracle-correct alternatives), write validation YAML;
#   3. the decode shape cuBLAS block-wise refuses (M=1), through `skill-run run`;
#   4. the batched row-wise and a16wi4 MoE baselines profiled, then the runner on those traces
#      (shapes the traces cannot determine are given with --shape, provenance `user`).
# Everything the runner writes is packed into $OUT/evidence.tgz.
#   4r. the row-wise half of 4 only (baseline profile, runner on four shapes) plus a short same-session
#       table of the precise-accumulation cost at M=128/1024, N=1280, K=8192.
#   5. the batched row-wise benchmark (port vs the _scaled_mm loop vs _scaled_grouped_mm, all shapes).
#   6<c>:<i>/<n>  issue 11: `skill-run run` on part i of n of every recipe shape (tests.selects,
#      untuned ones included) of one sm_90 card, against all its references: the production kernels
#      (MSLK's CUTLASS ops from the carried mslk-cuda wheel; cuBLAS block-wise) and the earlier ones.
#      c = r (row-wise batched), m (a16wi4 MoE), b (block-scale). One part per device call, e.g.
#      STAGES="6r:1/3" ... "6r:3/3", "6m:1/3" ... "6b:3/3". Needs .whl (carry it) with mslk-cuda.
#   6t  tests/test_mslk_gpu.py: MSLK parity, refusals and kernel names, before the runner stages.
#   SKILLRUN_GIT_REVISION=<sha> STAGES="1 2 3 4 5" bash benchmarks/device_validate_sm90.sh
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" runner/skillrun/examples
STAGES=${STAGES:-"1 2 3 4"}
ROUNDS=${ROUNDS:-40}
GRAPH=${GRAPH:---cuda-graph}  # CUDA-graph replay for every slot (falls back to eager for all if one cannot be captured)
LOG="$OUT/device_validate.log"
EXAMPLE=runner/skillrun/examples/h200_fp8_blockscale_scaled_mm.pt.trace.json.gz
run() { echo "+ $*" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; echo "rc=$?" | tee -a "$LOG"; }
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "revision ${SKILLRUN_GIT_REVISION:-unknown}"
} >> "$LOG" 2>&1
for s in $STAGES; do
  case $s in
  1) run timeout 120 python3 -m skillrun.profiling.run --out "$EXAMPLE" --steps 1:4 -- \
       python3 benchmarks/workloads/fp8_blockscale_workload.py --iters 3 ;;
  2) run timeout 330 python3 -m skillrun --profile "$EXAMPLE" --run --rounds "$ROUNDS" $GRAPH --top 12 ;;
  3) run timeout 90 python3 -m skillrun run triton_fp8_blockscale_gemm_sm90 --shape 1,7168,2048 --rounds "$ROUNDS" $GRAPH ;;
  4) run timeout 60 python3 -m skillrun.profiling.run --out "$OUT/rowwise_baseline.trace.json.gz" --steps 2:4 -- \
       python3 benchmarks/workloads/fp8_rowwise_batched_workload.py
     run timeout 200 python3 -m skillrun --profile "$OUT/rowwise_baseline.trace.json.gz" --run --rounds "$ROUNDS" $GRAPH --top 8 \
       --shape batch=16,M=1,N=1280,K=8192 --shape batch=16,M=128,N=1280,K=8192 --shape batch=16,M=4096,N=8192,K=1024
     run timeout 200 python3 -m skillrun --profile kernels/skillrun_kernels/moe_a16wi4/traces/h200_dequant_grouped_bf16_baseline.trace.json.gz \
       --run --rounds "$ROUNDS" $GRAPH --top 8 --shape tokens=16,model_dim=7168,inter_dim=2048,experts=64,topk=8,group_size=32 \
       --shape tokens=1024,model_dim=7168,inter_dim=2048,experts=64,topk=8,group_size=32 ;;
  4r) run timeout 50 python3 -m skillrun.profiling.run --out "$OUT/rowwise_baseline.trace.json.gz" --steps 2:4 -- \
       python3 benchmarks/workloads/fp8_rowwise_batched_workload.py
     run timeout 170 python3 -m skillrun --profile "$OUT/rowwise_baseline.trace.json.gz" --run --rounds "$ROUNDS" $GRAPH --top 8 \
       --shape batch=16,M=1,N=1280,K=8192 --shape batch=16,M=128,N=1280,K=8192 \
       --shape batch=16,M=128,N=8192,K=1024 --shape batch=16,M=4096,N=8192,K=1024
     run timeout 85 python3 benchmarks/bench_fp8_rowwise_batched_sm90.py --m 128 1024 --n 1280 --acc-ablation \
       --out "$OUT/fp8_rowwise_acc_ablation.json" ;;
  5) run timeout 200 python3 benchmarks/bench_fp8_rowwise_batched_sm90.py --sweep --budget-s 150 --out "$OUT/fp8_rowwise_bench.json" ;;
  6t) # MSLK on the device first: parity of each MSLK reference, the group-32 refusal, and the slot
      # regexes against the kernel names the profiler records (tests/test_mslk_gpu.py).
     run timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_mslk_gpu.py ;;
  6?:*/*)
     case ${s:1:1} in r) card=triton_fp8_rowwise_batched_gemm_sm90 ;; m) card=triton_moe_a16wi4_sm90 ;;
                      b) card=triton_fp8_blockscale_gemm_sm90 ;; *) echo "unknown card letter in $s" | tee -a "$LOG"; continue ;; esac
     # Say which MSLK this run has (or why none): an artifact's references then read `unavailable`.
     run python3 -c "import mslk, torch; from skillrun_kernels import _mslk; print(_mslk.version(), 'ops:', \
       [n for n in ('f8f8bf16_rowwise_batched', 'f8f8bf16_groupwise', 'bf16i4bf16_shuffled_grouped', \
        'bf16i4bf16_rowwise_batched', 'bf16bf16bf16_grouped_stacked', 'preshuffle_i4') if hasattr(torch.ops.mslk, n)])"
     # shellcheck disable=SC2046  (one --shape per word)
     run timeout 570 python3 -m skillrun run "$card" $(python3 benchmarks/recipe_shapes.py "$card" --untuned --part "${s#*:}") \
       --rounds "$ROUNDS" $GRAPH ;;
  esac
done
tar czf "$OUT/evidence.tgz" validation runner/skillrun/examples "$OUT"/*.trace.json.gz 2>/dev/null
ls -la "$OUT" >> "$LOG"
