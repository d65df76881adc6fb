#!/bin/bash
# `skill-run e2e` on the lent H200 (device tool): each bundled baseline workload run as-is and with
# the sm_90 ports routed in (A/B interleaved, an A/A pair, one profiled run per arm); the e2e records
# land in validation/e2e/ and are packed into $OUT/e2e_evidence.tgz. One stage per device call keeps
# each under the 10-minute limit:
#   bs    block-scale workload, bundled trace: only the shapes the card expects to win (M=64)
#   bsall the same with --include-slower (every planned shape routed, prefill included)
#   moe   a16wi4 MoE baseline (dequant + grouped bf16 GEMMs), the whole layer routed to the port
#   row   batched row-wise baseline (per-batch _scaled_mm loop), profiled first, the loop routed batched
#   SKILLRUN_GIT_REVISION=<sha> STAGES="bs moe" bash benchmarks/e2e_validate_sm90.sh
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STAGES=${STAGES:-"bs"}
N=${N:-5}
LOG="$OUT/e2e_validate.log"
BS_TRACE=runner/skillrun/examples/h200_fp8_blockscale_scaled_mm.pt.trace.json.gz
MOE_TRACE=kernels/skillrun_kernels/moe_a16wi4/traces/h200_dequant_grouped_bf16_baseline.trace.json.gz
run() { echo "+ $*" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; echo "rc=$?" | tee -a "$LOG"; }
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "revision ${SKILLRUN_GIT_REVISION:-unknown}"
} >> "$LOG" 2>&1
for s in $STAGES; do
  case $s in
  bs) run timeout 560 python3 -m skillrun e2e --profile "$BS_TRACE" -n "$N" --timeout 120 -- \
        python3 benchmarks/workloads/fp8_blockscale_workload.py ;;
  bsall) run timeout 560 python3 -m skillrun e2e --profile "$BS_TRACE" --include-slower -n "$N" --timeout 120 -- \
        python3 benchmarks/workloads/fp8_blockscale_workload.py ;;
  moe) run timeout 560 python3 -m skillrun e2e --profile "$MOE_TRACE" -n "$N" --timeout 120 \
        --shape 16,7168,2048,64,8,32 --shape 1024,7168,2048,64,8,32 -- python3 benchmarks/workloads/moe_a16wi4_workload.py ;;
  row) run timeout 90 python3 -m skillrun.profiling.run --out "$OUT/rowwise_baseline.trace.json.gz" --steps 2:5 -- \
        python3 benchmarks/workloads/fp8_rowwise_batched_workload.py
       run timeout 480 python3 -m skillrun e2e --profile "$OUT/rowwise_baseline.trace.json.gz" -n "$N" --timeout 120 \
        --shape batch=16,M=1,N=1280,K=8192 --shape batch=16,M=128,N=1280,K=8192 --shape batch=16,M=4096,N=8192,K=1024 -- \
        python3 benchmarks/workloads/fp8_rowwise_batched_workload.py ;;
  *) echo "unknown stage $s" | tee -a "$LOG" ;;
  esac
done
tar czf "$OUT/e2e_evidence.tgz" validation/e2e 2>/dev/null
echo "wrote $OUT/e2e_evidence.tgz" | tee -a "$LOG"
