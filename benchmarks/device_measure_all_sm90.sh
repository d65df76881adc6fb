#!/bin/bash
# Every recipe shape of the four sm_90 cards (55: their tests.selects cases, untuned ones included)
# in one device call bounded by BUDGET_S seconds (default 540 of the call's 600), issue 35:
#   - one measurement session per card (the port's, the references' and the judge's processes start
#     once and serve every shape), each timed session stopping on confidence;
#   - the kernels compiled ahead: the carried folder (.cache/compile, seeded on a CPU, below) is
#     relocated and set as TRITON_CACHE_DIR, and whatever it lacks is compiled on the host's cores
#     while the GPU measures;
#   - shapes in value order (trace share x how uncertain the current evidence is), each started only
#     if it fits in what is left of the budget; the manifest ($OUT/manifest.json) says what ran, what
#     each shape cost by phase, and what is left; commit it as $MANIFEST_IN and the same command in
#     the next call resumes it.
# Before the call, on a CPU (no GPU needed; Triton's ptxas compiles for sm_90a):
#   PYTHONPATH=runner:kernels python3 -m skillrun.execute.compile_ahead --cache .cache/compile --prune \
#     triton_fp8_blockscale_gemm_sm90 triton_fp8_rowwise_batched_gemm_sm90 triton_moe_a16wi4_sm90 triton_moe_fp8_blockscale_sm90
# The call (device tool; carry .whl, see .ci/device-env.sh, and .cache/compile):
#   SKILLRUN_GIT_REVISION=$(git rev-parse --short HEAD) BUDGET_S=540 OUT=$OUT bash benchmarks/device_measure_all_sm90.sh
# FIRST="card:shape ..." runs those shapes first, re-measured even when the manifest has them done (the
# shapes a bench compares in the same call: benchmarks/device_issue39.sh).
# Out: device_measure_all.log, manifest.json, validate.json (one row per shape), evidence.tgz (validation/).
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-540}
ROUNDS=${ROUNDS:-200}  # a cap only: sessions stop on confidence (3 s per shape, 10 s on a close call)
CACHE=${COMPILE_CACHE:-.cache/compile}
MANIFEST_IN=${MANIFEST_IN:-benchmarks/results/manifest_sm90.json}
CARDS=${CARDS:-"triton_fp8_blockscale_gemm_sm90 triton_fp8_rowwise_batched_gemm_sm90 triton_moe_a16wi4_sm90 triton_moe_fp8_blockscale_sm90"}
LOG="$OUT/device_measure_all.log"
FIRST_ARGS=(); for t in $FIRST; do FIRST_ARGS+=(--first "$t"); done
START=$SECONDS
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "revision ${SKILLRUN_GIT_REVISION:-unknown} budget ${BUDGET_S}s rounds<=${ROUNDS} cache ${CACHE} manifest ${MANIFEST_IN} first: ${FIRST:-none}"
  ls "$CACHE" 2>/dev/null || echo "no compile cache carried: every kernel compiles on this host"
} >> "$LOG" 2>&1
if [ -f "$MANIFEST_IN" ] && [ ! -f "$OUT/manifest.json" ]; then cp "$MANIFEST_IN" "$OUT/manifest.json"; fi
LEFT=$((BUDGET_S - (SECONDS - START)))
# shellcheck disable=SC2086  (one card per word)
timeout -k 10 $((LEFT + 30)) python3 benchmarks/validate_recipes.py $CARDS --budget "$LEFT" --rounds "$ROUNDS" \
  --manifest "$OUT/manifest.json" --compile-cache "$CACHE" --out "$OUT/validate.json" "${FIRST_ARGS[@]}" 2>&1 | tee -a "$LOG"
echo "rc=${PIPESTATUS[0]} after $((SECONDS - START)) s" | tee -a "$LOG"
tar czf "$OUT/evidence.tgz" validation 2>/dev/null
ls -la "$OUT" >> "$LOG"
