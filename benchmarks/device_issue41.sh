#!/bin/bash
# Issue 41 on the lent H200 (device tool, kind nvidia-h200): MoE decode at the memory roof, every lever
# measured against the incumbent recipe and the production references, and the e2e records. Run from
# the repository root; everything lands under $OUT. One STAGE per device call (each fits 10 minutes):
#
#   a16   a16wi4 decode levers: benchmarks/bench_moe_decode_roof_sm90.py (every ABLATIONS variant of
#         moe_a16wi4/triton_sm90_decode.py, the incumbent recipe, MSLK bf16i4bf16_shuffled_grouped at
#         group 128 and MSLK bf16 grouped; tokens 1 and 16, E64/I2048 then E384/I512 while the budget
#         lasts; % of the copy roof measured in the same process), then `skill-run tune` at tokens 16
#         and 1 (E64, I2048, group 128): the decode recipes' tunable_kernels on the runner (artifacts in
#         validation/_tuning/). Needs .whl/ with mslk-cuda (carry it; .ci/device-env.sh says how to
#         fetch it); without it MSLK is recorded unavailable.
#   fp8   fp8 block-scale decode levers: DeepGEMM built first when .deps/deepgemm-src.tar.gz (or a
#         prebuilt .deps/deepgemm-built.tgz) is carried (benchmarks/device_deepgemm_build.sh; without it
#         DeepGEMM's grouped references are recorded unavailable with the import error), then the bench
#         for tokens 1 and 16 (DeepSeek-V3: E256, I2048, top-8) against DeepGEMM grouped masked and
#         contiguous (issue 40's names deepgemm_grouped_masked / _contiguous, else the card's builders)
#         and cuBLAS per expert; then `skill-run tune` at tokens 1 if the budget is left.
#   e2e   the e2e records with per-arm oracle judgement: row-wise and a16wi4 (benchmarks/e2e_validate_sm90.sh
#         stages row, moe) and the fp8 MoE workload (benchmarks/device_moe_fp8bs_sm90.sh, its recipe
#         step skipped), N alternations each.
#
#   run(kind="nvidia-h200", carry=[".whl"], timeout_s=600,
#       command="SKILLRUN_GIT_REVISION=<sha> STAGE=a16 OUT=$OUT bash benchmarks/device_issue41.sh")
#   run(kind="nvidia-h200", carry=[".whl", ".deps"], timeout_s=600,
#       command="SKILLRUN_GIT_REVISION=<sha> STAGE=fp8 OUT=$OUT bash benchmarks/device_issue41.sh")
#   run(kind="nvidia-h200", carry=[".whl"], timeout_s=600,
#       command="SKILLRUN_GIT_REVISION=<sha> STAGE=e2e OUT=$OUT bash benchmarks/device_issue41.sh")
#
# Env: STAGE (a16 | fp8 | e2e), BUDGET_S (570: the whole call), REPS (30: bench rounds), ROUNDS (30: tune
# rounds), N (2: e2e alternations), APPLY (unset; 1 = `tune --apply`, the proposed recipes written into the
# cards, which then come back in the archive). Every artifact this call writes (validation/**), the cards
# and the sub-scripts' files ($OUT/work_<stage>/: traces, logs, e2e JSON, the DeepGEMM build) are packed
# into $OUT/issue41_<stage>.tgz; the bench JSONs and this log stay beside it (4 files at most come back).
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STAGE=${STAGE:-a16}
BUDGET_S=${BUDGET_S:-570}
REPS=${REPS:-30}
ROUNDS=${ROUNDS:-30}
N=${N:-2}
LOG="$OUT/issue41_${STAGE}.log"
START=$SECONDS
# `run LIMIT cmd...`: bounded by LIMIT seconds and by what is left of the budget; both streams to the log
RUN_MERGE=1
source benchmarks/device_budget.sh
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "revision ${SKILLRUN_GIT_REVISION:-unknown} stage $STAGE budget ${BUDGET_S}s"
} >> "$LOG" 2>&1
MARK=$(mktemp); touch "$MARK"
# sub-scripts' files go here and into the archive: the device tool brings back at most 8 files
WORK="$OUT/work_${STAGE}"
mkdir -p "$WORK"
TUNE_APPLY=(); [ "${APPLY:-}" = 1 ] && TUNE_APPLY=(--apply)

case $STAGE in
a16)
  run 30 python3 -c "from skillrun_kernels import _mslk; import torch; print(_mslk.version(), 'ops:', \
    [n for n in ('bf16i4bf16_shuffled_grouped', 'preshuffle_i4', 'bf16bf16bf16_grouped_stacked') if hasattr(_mslk.namespace(), n)])"
  run 330 python3 benchmarks/bench_moe_decode_roof_sm90.py --family a16wi4 --tokens 16 1 --combos 64x2048,384x512 \
    --reps "$REPS" --budget-s 270 --out "$OUT/issue41_a16wi4_bench.json"
  # the runner on the levers: incumbent vs the tunable_kernels of the recipe this shape selects
  run 200 python3 -m skillrun tune triton_moe_a16wi4_sm90 --shape 16,7168,2048,64,8,128 --cuda-graph \
    --rounds "$ROUNDS" --top 3 "${TUNE_APPLY[@]}"
  run "$(left)" python3 -m skillrun tune triton_moe_a16wi4_sm90 --shape 1,7168,2048,64,8,128 --cuda-graph \
    --rounds "$ROUNDS" --top 3 "${TUNE_APPLY[@]}"
  ;;
fp8)
  if [ -f .deps/deepgemm-src.tar.gz ] || [ -f .deps/deepgemm-built.tgz ]; then
    run 240 env OUT="$WORK" bash benchmarks/device_deepgemm_build.sh
    [ -f "${DEEPGEMM_PREFIX:-/tmp/deepgemm}/env.sh" ] && source "${DEEPGEMM_PREFIX:-/tmp/deepgemm}/env.sh"
  else
    say "no .deps/deepgemm-src.tar.gz or .deps/deepgemm-built.tgz carried: DeepGEMM will be recorded unavailable"
  fi
  run 30 python3 -c "import deep_gemm; print('deep_gemm', getattr(deep_gemm, '__version__', '?'))"
  run 300 python3 benchmarks/bench_moe_decode_roof_sm90.py --family fp8 --tokens 1 16 \
    --reps "$REPS" --budget-s 240 --out "$OUT/issue41_fp8_bench.json"
  run "$(left)" python3 -m skillrun tune triton_moe_fp8_blockscale_sm90 --shape 1,7168,2048,256,8 --cuda-graph \
    --rounds "$ROUNDS" --top 3 "${TUNE_APPLY[@]}"
  ;;
e2e)
  # row-wise and a16wi4 MoE workloads (their e2e record judges each arm's outputs against the oracle);
  # the sub-scripts write their traces and logs under $WORK, packed into the archive below
  run 200 env OUT="$WORK" N="$N" STAGES="row" bash benchmarks/e2e_validate_sm90.sh
  run 180 env OUT="$WORK" N="$N" STAGES="moe" bash benchmarks/e2e_validate_sm90.sh
  # fp8 MoE: profile, analyse, e2e on the card's plan; its recipe step skipped (E2E_RESERVE_S = budget)
  B=$(( $(left) - 10 ))
  if [ "$B" -ge 60 ]; then
    run "$B" env OUT="$WORK" BUDGET_S=$B E2E_RESERVE_S=$B E2E_N="$N" bash benchmarks/device_moe_fp8bs_sm90.sh
  else
    say "skip the fp8 MoE e2e: ${B}s left"
  fi
  ;;
*) say "unknown STAGE $STAGE (a16 | fp8 | e2e)" ;;
esac

# every artifact this call wrote, the two cards (changed only with APPLY=1) and the log, in one archive
NEW=$(find validation -type f -newer "$MARK" 2>/dev/null)
rm -f "$MARK"
tar czf "$OUT/issue41_${STAGE}.tgz" $NEW skills/triton_moe_a16wi4_sm90/SKILL.md skills/triton_moe_fp8_blockscale_sm90/SKILL.md \
  -C "$OUT" "work_${STAGE}" 2>/dev/null && rm -rf "$WORK"
say "stage $STAGE done in $((SECONDS - START))s of ${BUDGET_S}s; $(echo $NEW | wc -w) artifact(s) in $OUT/issue41_${STAGE}.tgz"
