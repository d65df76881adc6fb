"""Runner vs bench on the same shapes, same device run: do the two agree within the A/A noise?

    python3 benchmarks/compare_runner_bench.py --validate $OUT/validate.json --bench $OUT/fp8bs.json

For each block-scale shape in both files: the runner's port/cuBLAS block-wise ratio (from the
validation record's references) and the bench's (`speedup_vs_cublas_blockwise`, graph replay of R
calls), their difference in percent, and the runner's A/A noise and port spread. Exit 1 if a shape
with a port time >= 50 us disagrees by more than 3 %.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--validate", type=Path, required=True)
    ap.add_argument("--bench", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = json.loads(a.validate.read_text())
    bench = json.loads(a.bench.read_text())
    by_shape = {}
    for r in bench.get("table", []):
        M, N, K = r["shape"] if isinstance(r.get("shape"), list) else (r.get("M"), r.get("N"), r.get("K"))
        by_shape[(M, N, K)] = r
    out, bad = [], 0
    for row in rows:
        if row.get("card") != "triton_fp8_blockscale_gemm_sm90" or not row.get("references"):
            continue
        s = row["shape"]
        b = by_shape.get((s["M"], s["N"], s["K"]))
        ref = next((x for x in row["references"] if x["name"] in ("cublas_blockwise", "baseline") or x.get("production")), None)
        if not b or not ref or not ref.get("speedup") or not b.get("speedup_vs_cublas_blockwise"):
            continue
        rr, br = ref["speedup"], b["speedup_vs_cublas_blockwise"]
        diff = 100.0 * (rr / br - 1.0)
        long_enough = (row.get("port_median_ms") or 0) >= 0.05
        ok = abs(diff) <= 3.0 or not long_enough
        bad += not ok
        out.append({"shape": s, "runner_ratio": rr, "bench_ratio": br, "diff_pct": round(diff, 2), "aa_noise_pct": row.get("aa_noise_pct"),
                    "port_spread_pct": row.get("port_spread_pct"), "port_ms": row.get("port_median_ms"), "agree": ok})
        print(f"{s['M']}x{s['N']}x{s['K']}: runner {rr:.4f}x bench {br:.4f}x diff {diff:+.2f}% "
              f"aa {row.get('aa_noise_pct')} spread {row.get('port_spread_pct')} {'ok' if ok else 'DISAGREE'}")
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
