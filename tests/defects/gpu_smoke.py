"""End-to-end proof of the CUDA backend on a real GPU (run on the lent H200).

    source .ci/device-env.sh && python3 tests/defects/gpu_smoke.py --out "$OUT"

Runs the toy fp16 GEMM cards through ``skillrun.execute.run_skill`` on the ``cuda`` backend:
the Triton toy port against torch.mm (cuBLAS) with interleaved event timing, cold-L2 rotation,
A/A noise and profiler integrity; the same with CUDA-graph replay; a port that secretly calls
cuBLAS (must fail slot integrity); a port that aborts (must fail its row only). Prints a table and
writes records.json, artifacts.tar and report.html under --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from defects.kb import make_defect_kb  # noqa: E402
from skillrun.execute import run_skill  # noqa: E402
from skillrun.kb.index import SkillIndex  # noqa: E402
from skillrun.output.report import report_table, write_html  # noqa: E402

RUNS = [
    ("toy_triton", {"M": 4096, "N": 4096, "K": 4096}, {}),
    ("toy_triton", {"M": 256, "N": 4096, "K": 4096}, {"cuda_graph": True}),
    ("toy_triton_cheat", {"M": 4096, "N": 4096, "K": 4096}, {"rounds": 10}),
    ("defect_abort", {"M": 256, "N": 256, "K": 256}, {}),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="smoke-"))
    index = SkillIndex.load(make_defect_kb(work / "kb"))
    vroot = work / "validation"
    records = []
    for card_id, shape, kw in RUNS:
        t0 = time.time()
        opts = {"rounds": args.rounds, "timeout_s": 120, **kw}
        (rec,) = run_skill(index, card_id, [shape], validation_root=vroot, **opts)
        rec["_wall_s"] = round(time.time() - t0, 1)
        records.append(rec)
        t = rec.get("timing") or {}
        print(f"[{rec['_wall_s']:6.1f}s] {card_id} {shape}: {rec['verdict']} | speedup={rec.get('speedup')} "
              f"port={(t.get('port_ms') or {}).get('median')} base={(t.get('baseline_ms') or {}).get('median')} "
              f"aa={t.get('aa_noise_pct')} | {rec['reason'][:300]}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "records.json").write_text(json.dumps(records, indent=1, default=str))
    with tarfile.open(args.out / "artifacts.tar", "w") as tar:
        tar.add(vroot, arcname="validation")
    write_html(records, args.out / "report.html")
    from rich.console import Console

    Console(width=220).print(report_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
