#!/bin/bash
# Issue 23 on the lent H200: what the CPU work of this issue needs a device for. One stage per call
# is safest (each call has 600 s); several fit when the earlier ones are quick. Carry .deps (the
# DeepGEMM source copy, 2.7 MB) and .whl (pytest etc., as for device_gluon_sm90.sh).
#   STAGES=deepgemm      COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device_issue23.sh   (~4 min)
#   STAGES="smoke runner" COMMIT=... bash benchmarks/device_issue23.sh                             (~2 + 4 min)
#   STAGES=tune SHAPE=8192,8192,8192 COMMIT=... bash benchmarks/device_issue23.sh                  (~6-9 min)
# Stages:
#   deepgemm  benchmarks/device_deepgemm_build.sh: builds deep_gemm on this machine into /tmp/deepgemm
#             (kept while the machine stays warm; $OUT/deepgemm-built.tgz can be carried back as
#             .deps/deepgemm-built.tgz to skip the build on a fresh machine), smoke-tests fp8_gemm_nt.
#   smoke     device_gluon_sm90.sh's smoke stage: every Gluon ablation twin under the launch watchdog;
#             the no_promote twins (fixed in gluon_sm90._prev_slot) must now return: their entries in
#             $OUT/gluon_smoke.json say ok, or timeout with the kernel and config named.
#   runner    skill-run on the five large shapes of the issue, CUDA graphs: cuBLAS block-wise, padded,
#             MSLK and DeepGEMM as references, the verdict naming the fastest oracle-correct production
#             kernel; validation YAML packed in $OUT/evidence.tgz.
#   tune      skill-run tune on $SHAPE: the recipe's Triton space and the Gluon kernel's space
#             (tunable_kernels) in the same sessions; proposes a recipe only beyond the A/A noise
#             (no --apply: the lead decides). The tuning artifact lands in validation/_tuning/.
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STAGES=${STAGES:-"deepgemm smoke runner"}
COMMIT=${COMMIT:-${SKILLRUN_GIT_REVISION:-unknown}}
export COMMIT
LOG="$OUT/device_issue23.log"
run() { echo "+ $*" | tee -a "$LOG"; "$@" 2>&1 | tee -a "$LOG"; local rc=${PIPESTATUS[0]}; echo "rc=$rc" | tee -a "$LOG"; return $rc; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; echo "commit $COMMIT"; } >> "$LOG" 2>&1
for s in $STAGES; do
  case $s in
  deepgemm)
    run timeout 280 bash benchmarks/device_deepgemm_build.sh
    # make the freshly built package visible to the stages after this one in the same call
    if [ -f "${DEEPGEMM_PREFIX:-/tmp/deepgemm}/env.sh" ]; then source "${DEEPGEMM_PREFIX:-/tmp/deepgemm}/env.sh"; fi ;;
  smoke)
    run env STAGES=smoke bash benchmarks/device_gluon_sm90.sh
    python3 - "$OUT/gluon_smoke.json" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d.get("table", []):
    for n, i in (r.get("gluon_ablations") or {}).items():
        print("twin", n, "at", r["shape"], i.get("status", "ok"), "rel_err", i.get("rel_err"), (i.get("error") or "")[:200])
EOF
    ;;
  runner)
    run timeout 280 python3 -m skillrun run triton_fp8_blockscale_gemm_sm90 --rounds 40 --cuda-graph --seeds 2 \
      --shape 4096,65536,1536 --shape 4096,2048,7168 --shape 16384,1536,7168 --shape 16384,7168,768 --shape 8192,8192,8192 ;;
  tune)
    run timeout 560 python3 -m skillrun tune triton_fp8_blockscale_gemm_sm90 --shape "${SHAPE:-8192,8192,8192}" \
      --cuda-graph --rounds 30 --recheck-rounds 60 --seeds 2 --timeout 300 ;;
  esac
done
tar czf "$OUT/evidence.tgz" validation 2>/dev/null
ls -la "$OUT" >> "$LOG"
