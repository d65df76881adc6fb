"""Compile-only check (no GPU) of the fp8 block-scale MoE Triton port for sm_90: both GEMM kernels
at every recipe config of triton_moe_fp8_blockscale_sm90 (Triton's bundled ptxas: registers,
spills, shared memory, wgmma vs mma.sync). Catches configs that cannot compile or launch before
device time is spent; says nothing about speed.

    python benchmarks/compile_check_moe_fp8_sm90.py --out moe_fp8_compile.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compile_check_sm90 import compile_one  # noqa: E402

from skillrun_kernels.fp8_blockscale_moe import triton_sm90 as port  # noqa: E402

ROUTING = ["sorted_ptr", "block_expert_ptr", "valid_end_ptr", "num_rows_ptr"]


def _recipes() -> list[tuple[str, dict]]:
    from skillrun.kb.index import SkillIndex

    card = SkillIndex.load().skill("triton_moe_fp8_blockscale_sm90")
    return [(r.name, {**port.DEFAULT_DECODE, **r.config}) for r in card.recipes]


def check() -> list[dict]:
    rows = []
    for name, cfg in _recipes():
        s1_types = {"a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "h_ptr": "*fp8e4nv",
                    "hs_ptr": "*fp32", "zero_ptr": "*fp32", **{r: "*i32" for r in ROUTING}}
        s1_types.update({n: "i32" for n in ["D", "I", "zero_numel", "zero_per_prog", "stride_at", "stride_ast", "stride_we",
                                            "stride_wn", "stride_wse", "stride_wsn", "stride_ht", "stride_hst"]})
        s1_consts = {"TOPK": 8, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N1"], "BLOCK_K": port.BLOCK_K}
        s2_types = {"h_ptr": "*fp8e4nv", "hs_ptr": "*fp32", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "acc_ptr": "*fp32",
                    "tw_ptr": "*fp32", **{r: "*i32" for r in ROUTING}}
        s2_types.update({n: "i32" for n in ["I", "stride_ht", "stride_hst", "stride_we", "stride_wn", "stride_wse",
                                            "stride_wsn", "stride_at"]})
        s2_consts = {"TOPK": 8, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N2"], "BLOCK_K": port.BLOCK_K}
        for stage, fn, types, consts, w, s in (
            ("s1", port._moe_fp8bs_gate_up_kernel, s1_types, s1_consts, cfg["warps1"], cfg["stages1"]),
            ("s2", port._moe_fp8bs_down_kernel, s2_types, s2_consts, cfg["warps2"], cfg["stages2"]),
        ):
            div = [n for n, t in types.items() if t.startswith("*")] + ["D", "I"] * (stage == "s1") + ["I"] * (stage == "s2")
            try:
                info = compile_one(fn, types, consts, div, w, s)
            except Exception as exc:
                info = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            rows.append({"recipe": name, "stage": stage, "config": cfg, **info})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = check()
    if args.out:
        import subprocess

        import triton

        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "kernels/fp8_blockscale_moe"], capture_output=True,
                                    text=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip())
        doc = {"what": "compile-only (no GPU): Triton for sm_90, ptxas -v for sm_90a; not a measurement",
               "commit": head, "kernel_dirty": dirty, "triton": triton.__version__, "rows": rows}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
