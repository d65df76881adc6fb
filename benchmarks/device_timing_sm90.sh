#!/bin/bash
# The timing engine on the lent H200 (device tool), in one call:
#   0. environment: torch/triton/CUDA, the hold (torch.cuda._sleep calibrated against events), NVML clock;
#   1. the runner (benchmarks/validate_recipes.py, the same code as `skill-run run`) on the recipe shapes
#      given in TARGETS, CUDA-graph replay, ROUNDS rounds, within BUDGET_S seconds;
#   2. the block-scale bench on the five large shapes with the configs the runner selected, same run;
#   3. runner vs bench per shape (benchmarks/compare_runner_bench.py).
# Needs .whl carried (pydantic, jsonschema, ijson, orjson, google-re2, mslk-cuda; see .ci/device-env.sh).
#   TARGETS="triton_fp8_blockscale_gemm_sm90:4096,2048,7168 ..." BUDGET_S=360 bash benchmarks/device_timing_sm90.sh
# Every recipe shape of the sm_90 cards, over as many calls as it takes (each skips what the sustained
# engine already measured on this device class; commit the artifacts between calls):
#   TARGETS="triton_fp8_blockscale_gemm_sm90 triton_fp8_rowwise_batched_gemm_sm90 triton_moe_a16wi4_sm90 triton_moe_fp8_blockscale_sm90" \
#     SKIP_CURRENT=1 BENCH=0 SUSTAIN_SWEEP="" BUDGET_S=500 bash benchmarks/device_timing_sm90.sh
set -o pipefail
source .ci/device-env.sh
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
ROUNDS=${ROUNDS:-40}
BUDGET_S=${BUDGET_S:-360}
BENCH=${BENCH:-1}
LARGE="triton_fp8_blockscale_gemm_sm90:4096,65536,1536 triton_fp8_blockscale_gemm_sm90:4096,2048,7168 triton_fp8_blockscale_gemm_sm90:16384,1536,7168 triton_fp8_blockscale_gemm_sm90:16384,7168,768 triton_fp8_blockscale_gemm_sm90:8192,8192,8192"
TARGETS=${TARGETS:-$LARGE}
LOG="$OUT/device_timing.log"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  echo "revision ${SKILLRUN_GIT_REVISION:-unknown}"
  python3 - <<'PY'
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)
from skillrun.execute import timing
t = timing.EventTimer()
print("spin cycles/us", round(t.calibrate(), 1), "sm clock MHz", t.dev.sm_clock_mhz())
import re2, jsonschema, pydantic  # noqa: F401  the runner's own dependencies, carried as wheels
import os
import time
# The idle-start bias and its fix on this device: the same matmul in two slots (an A/A pair), with
# 2 ms of host work between rounds (what the harness's integrity checks do), without and with the hold.
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
gap = lambda info: time.sleep(0.002)  # noqa: E731
for hold in (False, True):
    tm = timing.EventTimer(hold=hold, sustain_ms=0.0)  # the hold's own effect, without the load
    r = timing.interleave({"big": [lambda: a @ a], "big#aa": [lambda: a @ a], "small": [lambda: b @ b]}, tm, 60, 3,
                          after_round=gap)
    med = {k: round(sorted(v)[len(v) // 2] * 1e3, 1) for k, v in r["samples"].items()}
    print(f"hold={hold}: median us {med}; position effect {r['position_effect']['max_pct']:.1f}% "
          f"({r['position_effect']['slot']}); unheld rounds {r['unheld_rounds']}; final hold {tm.hold_us:.0f} us; "
          f"by position {r['position_effect']['median_ms_by_position']}")
# The power state (timing.py rule 5): a compute-bound and a memory-bound slot, timed as the runner
# does (50 ms of host work between rounds: the device idles) and as a bench does (back to back), for
# several lengths of the sustained load queued before each round. With enough load the two styles
# must agree (ratio and clock); the clock is read once the hold has ended.
big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
slots = {"mm": [lambda: big @ big], "copy": [lambda: dst.copy_(src)]}
for sustain in [float(x) for x in os.environ.get("SUSTAIN_SWEEP", "0 20 100 400").split()]:
    row = {}
    for style, gap_s in (("runner", 0.05), ("bench", 0.0)):
        tm = timing.EventTimer(sustain_ms=sustain)
        after = (lambda info: time.sleep(gap_s)) if gap_s else None
        r = timing.interleave(slots, tm, 12, 2, after_round=after)
        med = {k: sorted(v)[len(v) // 2] for k, v in r["samples"].items()}
        clocks = sorted(c for c in r["round_info"]["clock_mhz"] if c)
        row[style] = (med["mm"] / med["copy"], clocks[len(clocks) // 2] if clocks else None, med["mm"] * 1e3)
    print(f"sustain {sustain:6.0f} ms: runner mm/copy {row['runner'][0]:.4f} at {row['runner'][1]} MHz (mm {row['runner'][2]:.0f} us); "
          f"bench {row['bench'][0]:.4f} at {row['bench'][1]} MHz (mm {row['bench'][2]:.0f} us); "
          f"runner/bench {row['runner'][0] / row['bench'][0]:.4f}", flush=True)
del big, src, dst
try:
    import mslk  # noqa: F401
    print("mslk ok")
except Exception as exc:
    print("mslk unavailable:", exc)
PY
} 2>&1 | tee -a "$LOG"
if [ -n "$GPU_TESTS" ]; then  # e.g. GPU_TESTS="tests/test_execute_untrusted.py tests/test_timing_engine.py"
  # shellcheck disable=SC2086
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -x $GPU_TESTS 2>&1 | tail -15 | tee -a "$LOG"
fi
# shellcheck disable=SC2086
timeout $((BUDGET_S + 60)) python3 benchmarks/validate_recipes.py $TARGETS --rounds "$ROUNDS" --budget-s "$BUDGET_S" \
  ${SKIP_CURRENT:+--skip-current} --out "$OUT/validate.json" 2>&1 | tee -a "$LOG"
if [ "$BENCH" = 1 ]; then
  # shellcheck disable=SC2086
  python3 benchmarks/validate_recipes.py $LARGE --emit-bench-configs "$OUT/bench_configs.json" >> "$LOG" 2>&1
  COMMIT=${SKILLRUN_GIT_REVISION:-unknown} timeout ${BENCH_TIMEOUT:-200} python3 benchmarks/bench_fp8_blockscale_sm90.py --shapes large \
    --configs "$OUT/bench_configs.json" --rounds 20 --budget-s 40 --out "$OUT/fp8bs_bench.json" 2>&1 | tail -40 | tee -a "$LOG"
  python3 benchmarks/compare_runner_bench.py --validate "$OUT/validate.json" --bench "$OUT/fp8bs_bench.json" \
    --out "$OUT/runner_vs_bench.json" 2>&1 | tee -a "$LOG"
fi
if [ -n "$MOE_BENCH" ]; then  # e.g. MOE_BENCH="--group-size 128 --combos 64x2048 --tokens 16 64"
  # shellcheck disable=SC2086
  timeout "${MOE_BENCH_TIMEOUT:-100}" python3 benchmarks/bench_moe_a16wi4_sm90.py $MOE_BENCH --out "$OUT/moe_bench.json" 2>&1 \
    | tail -30 | tee -a "$LOG"
fi
tar czf "$OUT/evidence.tgz" validation 2>/dev/null
