#!/bin/bash
# fp8 block-scale MoE (issue 26) on the lent H200 (device tool), stage by stage (the whole path in one
# bounded call: benchmarks/device_moe_fp8bs_sm90.sh). One stage per device call keeps each
# under the 10-minute limit; everything the runner writes is packed into $OUT/moe_fp8_evidence.tgz.
#   t   GPU tests: the port and the cuBLAS per-expert fallback against the oracle (two token counts),
#       and which production references load here (DeepGEMM, vLLM, SGLang: import errors printed)
#   c   compile-only facts for sm_90a on this image (registers, spills, wgmma) of every recipe config
#   d   `skill-run run` on the DeepSeek-V3 decode shapes (tokens 1, 16, 64; E=256, top-8, 7168 -> 2048)
#   p   the same at small batch / prefill (tokens 256, 2048, 4096) and the EP8 shard (E=32, 1024 tokens)
#   w   the bundled baseline workload profiled, then `skill-run --profile` on its trace (the dense
#       block-scale card is expected to answer: the fallback is a loop of dense GEMMs) and
#       `skill-run e2e` with the port routed in through route.py (plan from the synthetic DeepGEMM fixture)
#   SKILLRUN_GIT_REVISION=<sha> STAGES="t c d" bash benchmarks/device_moe_fp8_sm90.sh
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STAGES=${STAGES:-"t c d"}
ROUNDS=${ROUNDS:-40}
LOG="$OUT/device_moe_fp8.log"
CARD=triton_moe_fp8_blockscale_sm90
FIXTURE=tests/fixtures/kineto_h200_deepgemm_moe.synthetic.json
run() { echo "+ $*" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; echo "rc=$?" | tee -a "$LOG"; }
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "revision ${SKILLRUN_GIT_REVISION:-unknown}"
} >> "$LOG" 2>&1
for s in $STAGES; do
  case $s in
  t) run timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_blockscale_moe_cpu.py -k gpu -rs
     run python3 -c "
for mod in ('deep_gemm', 'vllm.model_executor.layers.fused_moe.fused_moe', 'sglang.srt.layers.moe.fused_moe_triton.fused_moe'):
    try:
        __import__(mod); print(mod, 'imports')
    except Exception as exc:
        print(mod, 'does not import:', type(exc).__name__, str(exc)[:200])" ;;
  c) run timeout 500 python3 benchmarks/compile_check_sm90.py --card $CARD --out "$OUT/moe_fp8_compile_h200.json" ;;
  d) run timeout 560 python3 -m skillrun run $CARD --rounds "$ROUNDS" --cuda-graph \
        --shape 1,7168,2048,256,8 --shape 16,7168,2048,256,8 --shape 64,7168,2048,256,8 ;;
  p) run timeout 560 python3 -m skillrun run $CARD --rounds "$ROUNDS" --cuda-graph \
        --shape 256,7168,2048,256,8 --shape 2048,7168,2048,256,8 --shape 4096,7168,2048,256,8 --shape 1024,7168,2048,32,8 ;;
  w) run timeout 200 python3 -m skillrun.profiling.run --out "$OUT/moe_fp8_baseline.trace.json.gz" --steps 2:5 -- \
        python3 benchmarks/workloads/fp8_blockscale_moe_workload.py
     run timeout 60 python3 -m skillrun --profile "$OUT/moe_fp8_baseline.trace.json.gz"
     run timeout 400 python3 -m skillrun e2e --profile "$FIXTURE" -n 3 --timeout 120 \
        --shape 16,7168,2048,256,8 --shape 4096,7168,2048,256,8 -- python3 benchmarks/workloads/fp8_blockscale_moe_workload.py ;;
  *) echo "unknown stage $s" | tee -a "$LOG" ;;
  esac
done
tar czf "$OUT/moe_fp8_evidence.tgz" validation/$CARD validation/e2e 2>/dev/null
echo "wrote $OUT/moe_fp8_evidence.tgz" | tee -a "$LOG"
