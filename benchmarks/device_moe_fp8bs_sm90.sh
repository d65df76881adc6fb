#!/bin/bash
# fp8 block-scale MoE (issue 26) end to end on the lent H200 (device tool), in one call bounded by
# BUDGET_S seconds (default 240). Run from the repository root; everything lands under $OUT:
#   1. the bundled sm_90 workload (benchmarks/workloads/fp8_blockscale_moe_workload.py: the cuBLAS
#      per-expert baseline layer at DeepSeek-V3 tokens 16 and 4096, the layer route.py wraps) under
#      torch.profiler through `skill-run profile` -> $OUT/moe_fp8bs_workload.trace.json.gz (Chrome trace)
#   2. `skill-run --profile` on that trace, text (-v: every criterion) and JSON
#      -> $OUT/analysis.txt, $OUT/analysis.json
#   3. the card's recipe shapes (tests.selects, untuned included) through the runner with timing,
#      one shape per recipe first (benchmarks/validate_recipes.py --recipes-first), in what is left of
#      the budget minus the e2e reserve -> $OUT/validate.json and the artifacts (in the archive below)
#   4. `skill-run e2e` on the same workload with the card's route (kernels/skillrun_kernels/fp8_blockscale_moe/route.py)
#      and step 2's plan cut to this card's items (benchmarks/plan_filter.py) -> $OUT/e2e.json
#   Every artifact written (validation/…) and the e2e plan -> $OUT/moe_fp8bs_evidence.tgz (the device
#   tool returns at most 8 files: log, trace, analysis.txt/.json, validate.json, e2e.json, the archive)
#   source .ci/device-env.sh is done here. Env: BUDGET_S (240), ROUNDS (30), E2E_N (2: A/B
#   alternations), E2E_RESERVE_S (120: kept back for step 4, whose workload runs, 8 with E2E_N=2
#   (A B A B, an A/A pair, one profiled run per arm), each import torch and build 22 GB of fp8
#   expert weights), SKILLRUN_GIT_REVISION (recorded). At 240 s step 3 reaches one or two
#   recipe shapes (each a fresh process with E=256 inputs and the fp32 oracle): BUDGET_S=500 in one
#   device call runs more of them (the device tool allows 600 s a call).
#   SKILLRUN_GIT_REVISION=$(git rev-parse --short HEAD) OUT=/tmp/out bash benchmarks/device_moe_fp8bs_sm90.sh
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-240}
ROUNDS=${ROUNDS:-30}
E2E_N=${E2E_N:-2}
E2E_RESERVE_S=${E2E_RESERVE_S:-120}
CARD=triton_moe_fp8_blockscale_sm90
WORKLOAD=benchmarks/workloads/fp8_blockscale_moe_workload.py
ROUTE=kernels/skillrun_kernels/fp8_blockscale_moe/route.py
# the workload's two shapes, named (the dense card's trace-read shapes are left alone)
SHAPES=(--shape tokens=16,model_dim=7168,inter_dim=2048,experts=256,topk=8
        --shape tokens=4096,model_dim=7168,inter_dim=2048,experts=256,topk=8)
TRACE="$OUT/moe_fp8bs_workload.trace.json.gz"
LOG="$OUT/device_moe_fp8bs.log"
START=$SECONDS
# `run LIMIT cmd...`: the command bounded by LIMIT seconds (and by what is left of the budget); its
# stdout is the caller's (a JSON answer redirected to a file stays clean), both streams go to the log
RUN_MIN_S=10
source benchmarks/device_budget.sh
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "revision ${SKILLRUN_GIT_REVISION:-unknown} budget ${BUDGET_S}s rounds $ROUNDS"
} >> "$LOG" 2>&1
MARK=$(mktemp); touch "$MARK"

# 1. profile the bundled workload (steps 2-4 of 6: set-up and the first step left out)
run 90 python3 -m skillrun profile --out "$TRACE" --steps 2:5 --no-analyze -- python3 "$WORKLOAD"

# 2. the runner's answer on that trace
if [ -s "$TRACE" ]; then
  run 60 python3 -m skillrun --profile "$TRACE" "${SHAPES[@]}" -v --wide > "$OUT/analysis.txt"
  run 60 python3 -m skillrun --profile "$TRACE" "${SHAPES[@]}" --json > "$OUT/analysis.json"
else
  say "no trace at $TRACE: steps 2 and 4 skipped"
fi

# 3. the card's recipe shapes with timing (two-axis verdicts), leaving E2E_RESERVE_S for step 4
VBUDGET=$(( $(left) - E2E_RESERVE_S ))
if [ "$VBUDGET" -ge 30 ]; then
  run $((VBUDGET + 30)) python3 benchmarks/validate_recipes.py "$CARD" --recipes-first --rounds "$ROUNDS" \
    --budget-s "$VBUDGET" --out "$OUT/validate.json"
else
  say "skip validate_recipes: ${VBUDGET}s of budget for it"
fi

# 4. e2e: the workload as-is vs with the port routed in, planned from step 1's trace (this card only)
if [ -f "$ROUTE" ] && [ -s "$OUT/analysis.json" ]; then
  if python3 benchmarks/plan_filter.py "$OUT/analysis.json" --card "$CARD" --out "$OUT/plan_moe.json" 2>&1 | tee -a "$LOG"; then
    run "$(left)" python3 -m skillrun e2e --plan "$OUT/plan_moe.json" -n "$E2E_N" --timeout 60 --json -- \
      python3 "$WORKLOAD" --iters 4 > "$OUT/e2e.json"
  else
    say "e2e skipped: the workload's trace gave no item of $CARD (see analysis.txt)"
  fi
else
  say "e2e skipped: no route ($ROUTE) or no analysis of the trace"
fi

# every artifact this call wrote (validation/<card>/*.yaml, validation/e2e/*), at its repository path,
# and the e2e plan, in one archive: the device tool brings back at most 8 files from $OUT
NEW=$(find validation -type f -newer "$MARK" 2>/dev/null)
rm -f "$MARK"
PLAN=(); [ -f "$OUT/plan_moe.json" ] && PLAN=(-C "$OUT" plan_moe.json)
if [ -n "$NEW" ] || [ ${#PLAN[@]} -gt 0 ]; then
  tar czf "$OUT/moe_fp8bs_evidence.tgz" $NEW "${PLAN[@]}" && rm -f "$OUT/plan_moe.json"
fi
say "done in $((SECONDS - START))s of ${BUDGET_S}s; $(echo $NEW | wc -w) artifact(s) in $OUT/moe_fp8bs_evidence.tgz"
