#!/bin/bash
# Issue 39 on the lent H200, in ONE device call: the runner on the sm_90 recipe shapes, the clean benches
# on a spread of the shapes the runner measured in this same call, the runner-vs-bench comparison shape by
# shape, and the GPU tests. The exact device-tool call (carry the runner's wheels, .ci/device-env.sh, and
# the compile cache seeded on a CPU as benchmarks/device_measure_all_sm90.sh says):
#   run(kind="nvidia-h200", timeout_s=600, carry=[".whl", ".cache/compile"],
#       command="SKILLRUN_GIT_REVISION=$(git rev-parse --short HEAD) STAGES='sandbox runner bench compare gpu_tests' BUDGET_S=570 bash benchmarks/device_issue39.sh")
# Stages, in the order STAGES names them; each is bounded by `timeout`, by its own limit and by what is left
# of BUDGET_S less what the stages after it are allotted (so a long runner never eats the benches' time):
#   runner     benchmarks/device_measure_all_sm90.sh (validate_recipes.py --budget, one session per card, the
#              compile cache) with FIRST = the default bench spread (benchmarks/bench_spread.py --defaults):
#              those shapes run first and are re-measured even when the manifest has them done, so the
#              benches compare against this call; then every other recipe shape in value order, while the
#              budget lasts. -> manifest.json, validate.json, evidence.tgz (validation/)
#   bench      bench_spread.py picks from validate.json the shapes the runner measured (the five large
#              block-scale, two row-wise batched, two a16wi4 MoE; the default spread fills in where the
#              runner did not reach a family); validate_recipes.py --emit-configs / --emit-bench-configs give
#              the runner's selected configs, passed to each bench as --configs so both time the same kernel;
#              then bench_fp8_blockscale_sm90.py, bench_fp8_rowwise_batched_sm90.py (one process per N) and
#              bench_moe_a16wi4_sm90.py (one per expert layout and group)
#   compare    benchmarks/compare_runner_bench.py -> runner_vs_bench.json (its exit 1 = a disagreement, logged)
#   gpu_tests  pytest -m gpu on tests/ -> gpu_tests.log (verbose, so a cut run still says how far it got)
# Out ($OUT, at most 8 files; 7 here): device_issue39.log, manifest.json, validate.json, evidence.tgz,
# runner_vs_bench.json, gpu_tests.log, extras.tgz (the bench JSONs, the spread and the runner's configs,
# device_measure_all.log, the GPU tests' JUnit XML; rebuilt after every stage so a cut call still returns it).
# Resume in a second call: commit the returned manifest.json as benchmarks/results/manifest_sm90.json (the
# default MANIFEST_IN of device_measure_all_sm90.sh; or pass MANIFEST_IN=<path>) and run the same command:
# done shapes are skipped. To spend a call on the shapes left only:
#   command="SKILLRUN_GIT_REVISION=$(git rev-parse --short HEAD) STAGES='runner' FIRST= BUDGET_S=570 bash benchmarks/device_issue39.sh"
# Env: STAGES, BUDGET_S (570), RUNNER_S (270), BENCH_S (180), COMPARE_S (15), GPU_TESTS_S (80), FIRST (the
# default spread; empty: none), MANIFEST_IN, PY (python3), DRY=1 (CPU check: every stage's command is printed
# instead of run; the spread is still picked from $OUT/validate.json).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
DRY=${DRY:-0}
# the dry run needs no wheels, GPU or network: only the stage plumbing and the shape choice are checked
[ "$DRY" = 1 ] || source .ci/device-env.sh
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
STAGES=${STAGES:-"sandbox runner bench compare gpu_tests"}
BUDGET_S=${BUDGET_S:-570}
# 270 + 180 + 15 + 80 + 15 (packing) = 560 of the 570: the runner's 240 s inside its stage hold the nine
# spread shapes at validate_recipes' default estimates (45 s a card's first shape, 15 s a warm one: 225 s)
SANDBOX_S=${SANDBOX_S:-30}
RUNNER_S=${RUNNER_S:-250}
BENCH_S=${BENCH_S:-180}
COMPARE_S=${COMPARE_S:-15}
GPU_TESTS_S=${GPU_TESTS_S:-80}
PACK_S=15  # the archives and the listing at the end
export COMMIT=${COMMIT:-${SKILLRUN_GIT_REVISION:-unknown}}
# bench outputs and other extras live outside $OUT until packed: a call cut mid-stage must not leave more
# than 8 files there (the tool would drop some, maybe validate.json)
WORK=$(mktemp -d)
LOG="$OUT/device_issue39.log"
START=$SECONDS
left() { echo $((BUDGET_S - (SECONDS - START))); }
say() { echo "$*" | tee -a "$LOG" >&2; }
# what the stages after $1 in STAGES are allotted: kept back from $1's limit
reserve_after() {
  local after=0 sum=0 s
  for s in $STAGES; do
    if [ "$after" = 1 ]; then
      case $s in sandbox) sum=$((sum + SANDBOX_S)) ;; runner) sum=$((sum + RUNNER_S)) ;; bench) sum=$((sum + BENCH_S)) ;;
        compare) sum=$((sum + COMPARE_S)) ;; gpu_tests) sum=$((sum + GPU_TESTS_S)) ;; esac
    fi
    [ "$s" = "$1" ] && after=1
  done
  echo "$sum"
}
# the limit of stage $1 (own limit $2): its own, or what is left less packing and the later stages
stage_limit() {
  local l=$(( $(left) - PACK_S - $(reserve_after "$1") ))
  [ "$2" -lt "$l" ] && l=$2
  echo "$l"
}
# `run LIMIT cmd...`: bounded by LIMIT and by what is left of the budget less packing; RUN_LOG (default the
# main log) gets its output. DRY=1 prints the command instead.
run() {
  local lim=$1; shift
  local l=$(( $(left) - PACK_S ))
  [ "$lim" -gt "$l" ] && lim=$l
  if [ "$lim" -lt 10 ]; then say "skip (budget: $(left)s left): $*"; return 124; fi
  if [ "$DRY" = 1 ]; then say "DRY [${lim}s] $*"; return 0; fi
  say "+ [${lim}s] $*"
  timeout -k 10 "$lim" "$@" 2>&1 | tee -a "${RUN_LOG:-$LOG}" >/dev/null
  local rc=${PIPESTATUS[0]}
  say "rc=$rc after $((SECONDS - START))s"
  return "$rc"
}
pack() {
  if [ -f "$OUT/device_measure_all.log" ]; then mv "$OUT/device_measure_all.log" "$WORK/"; fi
  tar czf "$OUT/extras.tgz" -C "$WORK" . 2>>"$LOG"
}
{
  date -u
  [ "$DRY" = 1 ] || nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
  echo "commit $COMMIT stages '$STAGES' budget ${BUDGET_S}s (runner ${RUNNER_S} bench ${BENCH_S} compare ${COMPARE_S} gpu_tests ${GPU_TESTS_S}) dry=$DRY"
} >> "$LOG" 2>&1

VALIDATE="$OUT/validate.json"
CONFIGS="$WORK/runner_configs.json"
BENCH_FILES=()
for stage in $STAGES; do
  case $stage in
  sandbox)
    # Which pieces of the sandbox this machine's CUDA stack survives (each candidate in its own child, all at
    # once): the runner's harness makes the same probe and leaves out what it must; this logs every answer.
    run "$SANDBOX_S" $PY -c "import json, sys; from skillrun.io import sandbox; t = json.dumps({'support': sandbox.support(), **sandbox.gpu_fit('cuda')}, indent=1); print(t); open(sys.argv[1], 'w').write(t)" "$WORK/sandbox_fit.json"
    # Where CUDA fails in every candidate, even with only the environment scrubbed, a sandboxed run would
    # measure nothing: the runner then runs unconfined (our own ports) and every artifact says sandbox off.
    if grep -q '"none_worked": true' "$WORK/sandbox_fit.json" 2>/dev/null; then
      export SKILLRUN_SANDBOX=off
      say "sandbox: the device works in no candidate; the runner runs with sandbox=off (recorded in each artifact)"
    fi ;;
  runner)
    FIRST=${FIRST-$($PY benchmarks/bench_spread.py --defaults)}
    lim=$(stage_limit runner "$RUNNER_S")
    # device_measure_all's own budget leaves 30 s of the stage for its header (nvidia-smi, wheels, torch
    # import) and a shape that overruns its estimate; the stage's timeout is the hard bound
    RUN_LOG="$WORK/runner_stage.log" run "$lim" env OUT="$OUT" BUDGET_S=$((lim - 30)) FIRST="$FIRST" \
      bash benchmarks/device_measure_all_sm90.sh
    say "runner: $(grep -c '"verdict"' "$VALIDATE" 2>/dev/null || echo 0) row(s) in validate.json" ;;
  bench)
    lim=$(stage_limit bench "$BENCH_S")
    END=$((SECONDS + lim))
    # picked for real in a dry run too: which shapes the benches time is what the dry run checks
    $PY benchmarks/bench_spread.py --validate "$VALIDATE" --json "$WORK/spread.json" > "$WORK/spread.txt" 2>>"$LOG"
    sed 's/^/spread: /' "$WORK/spread.txt" >> "$LOG"
    TARGETS=$(grep '^targets ' "$WORK/spread.txt" | cut -d' ' -f2-)
    # the caps below sum past the stage's limit only if every bench is slow: the block-scale one goes first
    # shellcheck disable=SC2086  (one target per word)
    run $((lim < 30 ? lim : 30)) $PY benchmarks/validate_recipes.py $TARGETS --emit-configs "$CONFIGS" \
      --emit-bench-configs "$WORK/bench_configs.json"
    cfg() { if [ -f "$1" ] || [ "$DRY" = 1 ]; then echo "--configs $1"; fi; }
    i=0
    while read -r fam args; do
      i=$((i + 1))
      room=$((END - SECONDS))
      case $fam in
      blockscale)
        f="$WORK/bench_blockscale.json"
        # the Gluon slot and the watchdog's probe child are left out: the bench times the runner's Triton
        # kernel against the same references, and the runner launched these configs minutes ago
        # shellcheck disable=SC2086
        run $((room < 95 ? room : 95)) $PY benchmarks/bench_fp8_blockscale_sm90.py $args $(cfg "$WORK/bench_configs.json") \
          --no-gluon --watchdog-s 0 --rounds 20 --out "$f" ;;
      rowwise_batched)
        f="$WORK/bench_rowwise_$i.json"
        # shellcheck disable=SC2086
        run $((room < 45 ? room : 45)) $PY benchmarks/bench_fp8_rowwise_batched_sm90.py $args $(cfg "$CONFIGS") --reps 20 --out "$f" ;;
      moe_a16wi4)
        f="$WORK/bench_moe_$i.json"
        # shellcheck disable=SC2086
        run $((room < 50 ? room : 50)) $PY benchmarks/bench_moe_a16wi4_sm90.py $args $(cfg "$CONFIGS") --reps 15 --out "$f" ;;
      *) continue ;;
      esac
      BENCH_FILES+=("$f")
    done < <(grep -v '^targets ' "$WORK/spread.txt") ;;
  compare)
    [ ${#BENCH_FILES[@]} -gt 0 ] || mapfile -t BENCH_FILES < <(ls "$WORK"/bench_*.json 2>/dev/null | grep -v bench_configs)
    BARGS=(); for f in "${BENCH_FILES[@]}"; do BARGS+=(--bench "$f"); done
    run "$(stage_limit compare "$COMPARE_S")" $PY benchmarks/compare_runner_bench.py --validate "$VALIDATE" "${BARGS[@]}" \
      --runner-configs "$CONFIGS" --out "$OUT/runner_vs_bench.json"
    ;;
  gpu_tests)
    RUN_LOG="$OUT/gpu_tests.log" run "$(stage_limit gpu_tests "$GPU_TESTS_S")" $PY -m pytest -m gpu -p no:cacheprovider -v -rfEs \
      --durations=15 -o faulthandler_timeout=120 tests --junitxml "$WORK/gpu_tests.xml"
    [ -f "$OUT/gpu_tests.log" ] && tail -5 "$OUT/gpu_tests.log" >> "$LOG" ;;
  *) say "unknown stage $stage" ;;
  esac
  pack
done

# the runner's validation/ evidence as device_measure_all_sm90.sh returns it (the GPU tests may add some)
[ -d validation ] && tar czf "$OUT/evidence.tgz" validation 2>>"$LOG"
pack
say "done in $((SECONDS - START))s of ${BUDGET_S}s"
ls -la "$OUT" >> "$LOG"
rm -rf "$WORK"
