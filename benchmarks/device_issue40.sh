#!/bin/bash
# Issue 40 on the lent H200: DeepGEMM as the block-scale production reference (dense and grouped MoE),
# and the Gluon kernel with DeepGEMM's levers (kernels/skillrun_kernels/fp8_blockscale_gemm/gluon_sm90_ws.py)
# swept toward its class. Stages run in the order given by STAGES, each bounded by its own limit and by
# what is left of BUDGET_S; everything lands in $OUT (at most 8 files come back):
#   env     versions, clocks, the DeepGEMM and Gluon imports
#   build   benchmarks/device_deepgemm_build.sh: deep_gemm from .deps/deepgemm-src.tar.gz (first call,
#           < 4 min), or the package a previous call left (.deps/deepgemm-built.tgz: unpack + smoke).
#           Also unpacks .deps/deepgemm-jit-cache.tgz (DeepGEMM JIT-compiles each kernel with nvcc at
#           its first call, ~10-30 s each: the cache this script packs at the end saves that next time)
#   tests   pytest -m gpu tests/test_fp8_blockscale_gluon_ws.py: oracle parity of every lever (cluster 2x1
#           with an odd number of row tiles and M = 1 included), determinism, the ceiling twins fail
#   bench   benchmarks/bench_fp8_blockscale_sm90.py on the five large shapes with --gluon-module
#           gluon_sm90_ws --gluon-ablations: the Triton port, cuBLAS block-wise (unpadded and padded),
#           bf16, MSLK groupwise, DeepGEMM fp8_gemm_nt and the Gluon design point in one interleaved
#           session per shape, then every lever (gluon_sm90_ws.ABLATIONS) against the design point
#   tune    skill-run tune on each large shape: the recipe's space plus the card's gluon_sm90_ws space (10
#           configs the CPU prune kept, results/gluon_sm90_ws_*_prune.json) against the incumbent and
#           cuBLAS block-wise; with APPLY=1 (default) a win beyond the A/A noise is written into SKILL.md
#           here (lint-checked) and comes back in the evidence archive for review
#   runner  skill-run run on the five large shapes: whatever the card selects now against every
#           production reference it names (cuBLAS block-wise and padded, MSLK groupwise, DeepGEMM)
#   moe     the fp8 block-scale MoE card's recipe shapes through the runner (benchmarks/validate_recipes.py,
#           one shape per recipe first): the Triton layer against DeepGEMM grouped contiguous and masked
#   (always, last) the evidence archive: new validation/ and tuning artifacts, SKILL.md files, JSON
#           summaries; and the DeepGEMM JIT cache
# Carry .whl (the runner's wheels, .ci/device-env.sh) and .deps (deepgemm-src.tar.gz, made on a CPU by
# benchmarks/make_deepgemm_src.sh; and after the first call the deepgemm-built.tgz and
# deepgemm-jit-cache.tgz it returned). Three calls of at most 10 minutes (a session's 30 minutes of device
# time hold two of them with the machine's start; the third in the next session):
#   call 1: run(kind="nvidia-h200", carry=[".whl", ".deps"], timeout_s=600,
#                command="STAGES='env build bench' BUDGET_S=585 COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device_issue40.sh")
#   then copy deepgemm-built.tgz and deepgemm-jit-cache.tgz from the returned files into .deps/ and
#   unpack issue40_evidence.tgz at the repository root (and commit what it holds)
#   call 2: the same with STAGES='env build tests tune'     (APPLY=1: the card as tune left it comes back)
#   call 3: the same with STAGES='env build runner moe'     (after call 2's card diff is reviewed and committed)
# Env: STAGES, BUDGET_S (585), COMMIT, APPLY (1), TUNE_ROUNDS (20), TUNE_S (85 per shape), RUN_ROUNDS (40),
# LARGE (the five shapes).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source .ci/device-env.sh
export PYTHONUNBUFFERED=1
STAGES=${STAGES:-"env build bench"}
BUDGET_S=${BUDGET_S:-585}
COMMIT=${COMMIT:-${SKILLRUN_GIT_REVISION:-unknown}}
export COMMIT SKILLRUN_GIT_REVISION=$COMMIT
APPLY=${APPLY:-1}
TUNE_ROUNDS=${TUNE_ROUNDS:-20}
TUNE_S=${TUNE_S:-85}
RUN_ROUNDS=${RUN_ROUNDS:-40}
CARD=triton_fp8_blockscale_gemm_sm90
MOE_CARD=triton_moe_fp8_blockscale_sm90
LARGE=${LARGE:-"4096,65536,1536 4096,2048,7168 16384,1536,7168 16384,7168,768 8192,8192,8192"}
LOG="$OUT/device_issue40.log"
START=$SECONDS
MARK=$(mktemp); touch "$MARK"
# `run LIMIT cmd...`: bounded by LIMIT seconds and by what is left of the budget (less 20 s for packing)
RUN_RESERVE_S=20
source benchmarks/device_budget.sh
DG_PREFIX=${DEEPGEMM_PREFIX:-/tmp/deepgemm}

for stage in $STAGES; do
  case $stage in
  env)
    {
      date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'sms', torch.cuda.get_device_properties(0).multi_processor_count)"
      python3 -c "from skillrun_kernels.fp8_blockscale_gemm import gluon_sm90_ws as w; print('gluon_sm90_ws import', w.GLUON_IMPORT_ERROR or 'ok')"
      python3 -c "import deep_gemm; print('deep_gemm', deep_gemm.__version__)" 2>&1 | tail -1
      echo "commit $COMMIT stages '$STAGES' budget ${BUDGET_S}s"
    } >> "$LOG" 2>&1 ;;
  build)
    if [ -f .deps/deepgemm-jit-cache.tgz ]; then
      mkdir -p "$DG_PREFIX/jit-cache" && tar xzf .deps/deepgemm-jit-cache.tgz -C "$DG_PREFIX" && say "DeepGEMM JIT cache unpacked"
    fi
    run 240 bash benchmarks/device_deepgemm_build.sh
    # the build script writes $DG_PREFIX/env.sh; device-env.sh sources it only if it existed then
    if [ -f "$DG_PREFIX/env.sh" ]; then source "$DG_PREFIX/env.sh"; fi
    python3 -c "import deep_gemm; print('deep_gemm', deep_gemm.__version__, 'loads')" 2>&1 | tail -1 | tee -a "$LOG" ;;
  tests)
    run 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_blockscale_gluon_ws.py \
      --junitxml "$OUT/gluon_ws_gpu_tests.xml" ;;
  bench)
    SHAPES=$(echo $LARGE | tr ' ,' ',x')
    run 330 python3 benchmarks/bench_fp8_blockscale_sm90.py --shapes "$SHAPES" --rounds 15 \
      --gluon-module gluon_sm90_ws --gluon-ablations --ablation-rounds 9 --watchdog-s 60 --budget-s 60 \
      --out "$OUT/fp8bs_ws_bench.json"
    python3 - "$OUT/fp8bs_ws_bench.json" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d.get("table", []):
    s = r.get("slots", {})
    tf = {k: round(v["tflops"]) for k, v in s.items() if "tflops" in v}
    bad = {k: v.get("status") or v.get("error", "")[:80] for k, v in s.items() if v.get("status") not in (None, "ok")}
    print(r.get("shape"), "TF", tf, "gluon/cublas", r.get("gluon_speedup_vs_cublas_blockwise"),
          "gluon/deepgemm", r.get("gluon_speedup_vs_deepgemm"), "not run:", bad)
    for n, a in (r.get("gluon_ablations") or {}).items():
        print("   lever", n, "time/design", a.get("time_vs_design"), "parity", a.get("parity_ok"), a.get("status", ""))
from skillrun_kernels.fp8_blockscale_gemm import gluon_sm90_ws as w
print("cluster occupancy (kernel, size) -> clusters:", w.CLUSTER_OCCUPANCY)
PY
    ;;
  tune)
    FLAGS=(--cuda-graph --rounds "$TUNE_ROUNDS" --recheck-rounds "$RUN_ROUNDS" --top 2 --seeds 1 --timeout 180)
    [ "$APPLY" = 1 ] && FLAGS+=(--apply)
    for s in $LARGE; do
      run "$TUNE_S" python3 -m skillrun tune "$CARD" --shape "$s" "${FLAGS[@]}" --json > "$OUT/tune_${s//,/x}.json"
    done ;;
  runner)
    ARGS=(); for s in $LARGE; do ARGS+=(--shape "$s"); done
    run 200 python3 -m skillrun run "$CARD" "${ARGS[@]}" --rounds "$RUN_ROUNDS" --cuda-graph --seeds 2 ;;
  moe)
    run 400 python3 benchmarks/validate_recipes.py "$MOE_CARD" --recipes-first --rounds 30 \
      --budget-s $(( $(left) - 60 )) --out "$OUT/moe_validate.json" ;;
  *) say "unknown stage $stage" ;;
  esac
done

# pack: every artifact written in this call at its repository path, the cards (tune --apply edits them
# here), the JSON summaries that are not separate files; and the DeepGEMM JIT cache for the next call
NEW=$(find validation -type f -newer "$MARK" 2>/dev/null)
rm -f "$MARK"
EXTRA=$(ls "$OUT"/tune_*.json "$OUT"/moe_validate.json 2>/dev/null)
tar czf "$OUT/issue40_evidence.tgz" $NEW skills/$CARD/SKILL.md skills/$MOE_CARD/SKILL.md \
  $(for f in $EXTRA; do echo "-C $OUT $(basename "$f")"; done) 2>>"$LOG" && rm -f $EXTRA
if [ -d "$DG_PREFIX/jit-cache" ]; then tar czf "$OUT/deepgemm-jit-cache.tgz" -C "$DG_PREFIX" jit-cache; fi
git diff --stat -- skills >> "$LOG" 2>/dev/null
say "done in $((SECONDS - START))s of ${BUDGET_S}s; $(echo $NEW | wc -w) artifact(s) in issue40_evidence.tgz"
ls -la "$OUT" >> "$LOG"
