"""Compile-only check of the sm_90 Triton ports on a machine without a GPU.

Compiles every candidate config the benchmarks would sweep for target sm_90 (Triton's bundled
ptxas), then reports shared memory, registers and spills (ptxas -v) and which MMA instructions
the PTX uses (wgmma vs mma.sync). It catches configs that cannot compile or cannot launch
(shared memory over the 227 KB per-block limit) before device time is spent. Compile-only facts:
they say nothing about speed.

    python benchmarks/compile_check_sm90.py fp8 --out fp8_compile.json
    python benchmarks/compile_check_sm90.py fp8_splitk --out fp8_splitk_compile.json
    python benchmarks/compile_check_sm90.py moe --out moe_compile.json
    python benchmarks/compile_check_sm90.py gluon   # -> kernels/fp8_blockscale_gemm/results/gluon_sm90_<commit>_compile_only.json

``gluon`` compiles the warp-specialized Gluon block-scale kernel (``gluon_sm90.ABLATIONS``: the
design point and its one-knob ablations) for sm_90a and records, per variant, registers, spills,
shared memory, wgmma counts, the setmaxnreg values in PTX and SASS, ptxas's wgmma-serialisation
verdict and how many promote FMAs ptxas scheduled while a wgmma group was pending.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))

SM90_SMEM_LIMIT = 232448  # bytes per block (opt-in maximum on sm_90)
TARGET = GPUTarget("cuda", 90, 32)
DIV16 = [["tt.divisibility", 16]]


def _ptxas() -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")


def compile_one(fn, types: dict[str, str], constexprs: dict, div16: list[str], num_warps: int, num_stages: int) -> dict:
    names = fn.arg_names
    sig = {n: types.get(n, "constexpr") for n in names}
    attrs = {(names.index(n),): DIV16 for n in div16}
    t = time.perf_counter()
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    ck = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
    ptx = ck.asm["ptx"]
    info = {"compile_s": round(time.perf_counter() - t, 2), "shared_bytes": ck.metadata.shared,
            "fits_smem": ck.metadata.shared <= SM90_SMEM_LIMIT,
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "mma_sync": len(re.findall(r"\bmma\.sync", ptx))}
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    res = subprocess.run([_ptxas(), "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    m = re.search(r"Used (\d+) registers", res.stderr)
    s = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    info["registers"] = int(m.group(1)) if m else None
    info["spill_store_bytes"] = int(s.group(1)) if s else None
    return info


def check_fp8() -> list[dict]:
    import bench_fp8_rowwise_batched_sm90 as bench
    from skillrun_kernels.fp8_rowwise_batched_gemm import triton_sm90 as port

    types = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "out_ptr": "*bf16"}
    ints = ["M", "N", "K", "stride_xb", "stride_xm", "stride_xk", "stride_wb", "stride_wn", "stride_wk", "stride_ob", "stride_om", "stride_on"]
    types.update({n: "i32" for n in ints})
    rows, seen = [], set()
    # Each candidate with the K=8192 default promotion (every 128 of K) and without it (the K=1024
    # default): the promotion's partial accumulator costs registers on wgmma tiles.
    variants = [(cls, cfg, pa) for cls, cands in bench.CANDIDATES.items() for cfg in cands
                for pa in (port.PRECISE_ACC_DEFAULT, 0)]
    for cls, cfg, pa in variants:
        key = f"{bench.cfg_key(cfg)}_pa{pa}"
        if key in seen:
            continue
        seen.add(key)
        kn = cfg.get("w_layout") == "kn"
        # unit strides are specialized to the constant 1 at run time, as here
        consts = {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": cfg["BLOCK_K"],
                  "GROUP_M": cfg["GROUP_M"], "EVEN_K": True, "PRECISE_ACC": pa, "stride_xk": 1, "stride_on": 1,
                  ("stride_wn" if kn else "stride_wk"): 1}
        div = ["x_ptr", "w_ptr", "xs_ptr", "ws_ptr", "out_ptr", "M", "N", "K", "stride_xb", "stride_xm",
               "stride_wb", "stride_wk" if kn else "stride_wn", "stride_ob", "stride_om"]
        tys = {k: v for k, v in types.items() if k not in consts}
        try:
            info = compile_one(port._fp8_rowwise_bmm_kernel, tys, consts, div, cfg["num_warps"], cfg["num_stages"])
        except Exception as exc:
            info = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append({"class": cls, "config": key, **info})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def check_fp8_splitk() -> list[dict]:
    """The split-K weight-streaming variant over its declared tunable space (SPLIT_K is a run-time
    argument of the kernel, so it does not change the compiled code and is not enumerated)."""
    import itertools

    from skillrun_kernels.fp8_rowwise_batched_gemm import triton_sm90 as port
    from skillrun_kernels.fp8_rowwise_batched_gemm import triton_sm90_splitk as sk

    types = {"x_ptr": "*fp8e4nv", "w_ptr": "*fp8e4nv", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "acc_ptr": "*fp32"}
    types.update({n: "i32" for n in ["M", "N", "K", "k_per_split", "stride_xb", "stride_xm", "stride_wb", "stride_wn"]})
    div = ["x_ptr", "w_ptr", "xs_ptr", "ws_ptr", "acc_ptr", "M", "N", "K", "k_per_split", "stride_xb", "stride_xm",
           "stride_wb", "stride_wn"]
    t = sk.TUNABLE
    rows = []
    for bm, bn, bk, w, s, pa in itertools.product(t["BLOCK_M"], t["BLOCK_N"], t["BLOCK_K"], t["num_warps"],
                                                  t["num_stages"], (port.PRECISE_ACC_DEFAULT, 0)):
        consts = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "EVEN_K": True, "PRECISE_ACC": min(pa, bk),
                  "stride_xk": 1, "stride_wk": 1}
        key = f"{bm}x{bn}x{bk}_w{w}_s{s}_pa{pa}"
        try:
            info = compile_one(sk._fp8_rowwise_bmm_splitk_kernel, types, consts, div, w, s)
        except Exception as exc:
            info = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rows.append({"class": "splitk", "config": key, **info})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def check_moe() -> list[dict]:
    import bench_moe_a16wi4_sm90 as bench
    from skillrun_kernels.moe_a16wi4 import triton_sm90 as port

    ptr = {"x_ptr": "*bf16", "w_ptr": "*i8", "s_ptr": "*bf16", "h_ptr": "*bf16", "zero_ptr": "*fp32", "acc_ptr": "*fp32",
           "part_ptr": "*fp32",
           "tw_ptr": "*fp32", "sorted_ptr": "*i32", "block_expert_ptr": "*i32", "valid_end_ptr": "*i32", "num_rows_ptr": "*i32"}
    rows = []
    for inter in (512, 2048):
        for cls, cl in bench.CLASSES.items():
            for bm in cl["bm"]:
                for stage, cands in (("s1", cl["s1"]), ("s2", cl["s2"])):
                    for c in cands:
                        n, kk, w, s, split = (c[f"BLOCK_N{stage[1]}"], c[f"BLOCK_K{stage[1]}"], c[f"warps{stage[1]}"],
                                              c[f"stages{stage[1]}"], c[f"split{stage[1]}"])
                        fn = port._moe_a16wi4_gate_up_kernel if stage == "s1" else port._moe_a16wi4_down_kernel
                        # decode tiles also with the two decode levers (magic int4 conversion; split-K
                        # stage 1, whose atomics and third grid axis change the compiled code)
                        levers = [(False, 1)]
                        if cls == "decode":
                            levers += [(True, 1)] + ([(False, 4), (True, 4)] if stage == "s1" else [])
                        for magic, split_k in levers:
                            consts = {"TOPK": 8, "GROUP": 32, "BLOCK_M": bm, "BLOCK_N": n, "BLOCK_K": kk, "NG": kk // 32,
                                      "SPLIT": split, "SCALE_ACC": False, "MAGIC": magic}
                            if stage == "s1":
                                consts["SPLIT_K"] = split_k
                            names = fn.arg_names
                            tys = {a: ptr.get(a, "i32") for a in names if a not in consts}
                            tys.update({a: "i64" for a in ("zero_numel", "zero_per_prog") if a in tys})
                            div = [a for a in names if a in tys and a not in ("zero_numel", "zero_per_prog", "k_steps_per_split")]
                            try:
                                info = compile_one(fn, tys, consts, div, w, s)
                            except Exception as exc:
                                info = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                            key = bench.s1_key(c) if stage == "s1" else bench.s2_key(c)
                            key += ("_magic" if magic else "") + (f"_sk{split_k}" if split_k > 1 else "")
                            rows.append({"inter_dim": inter, "class": cls, "bm": bm, "stage": stage, "config": key, **info})
                            print(json.dumps(rows[-1]), flush=True)
        break  # the compiled code does not depend on inter_dim (a runtime value); one pass suffices
    return rows


def check_gluon(names: list[str] | None = None) -> list[dict]:
    from skillrun_kernels.fp8_blockscale_gemm import gluon_sm90 as g

    rows = []
    for name in names or list(g.ABLATIONS):
        try:
            info = g.compile_only(None, g.ABLATIONS[name])
            info["fits_smem"] = info["shared_bytes"] <= SM90_SMEM_LIMIT
        except Exception as exc:
            info = {"error": f"{type(exc).__name__}: {str(exc)[-300:]}"}
        rows.append({"variant": name, **info})
        print(json.dumps({k: rows[-1].get(k) for k in ("variant", "error", "regs", "spill_store_bytes", "shared_bytes", "wgmma",
                                                      "sass_ffma_while_qgmma_pending", "ptxas_wgmma_serialized", "compile_s")
                          if k in rows[-1]}), flush=True)
    return rows


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", choices=["fp8", "fp8_splitk", "moe", "gluon"])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--variants", nargs="*", default=None, help="gluon: ablation names (default: all)")
    args = ap.parse_args()
    if args.family == "gluon":
        commit = _commit()
        rows = check_gluon(args.variants)
        out = args.out or (Path(__file__).resolve().parents[1] / "kernels" / "fp8_blockscale_gemm" / "results"
                           / f"gluon_sm90_{commit}_compile_only.json")
        bad = [r for r in rows if "error" in r or not r.get("fits_smem") or (r.get("spill_store_bytes") or 0) > 0
               or r.get("ptxas_wgmma_serialized")]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "what": "compile only, no GPU: static facts of the Gluon kernel for sm_90a (nothing here is a measurement)",
            "target": "sm_90a", "triton": triton.__version__, "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "rows": rows}, indent=1) + "\n")
        print(f"{len(rows)} Gluon variants compiled for sm_90a; {len(bad)} failing, over shared memory, spilling "
              f"or serialised by ptxas -> {out}")
        return 1 if bad else 0
    rows = {"fp8": check_fp8, "fp8_splitk": check_fp8_splitk, "moe": check_moe}[args.family]()
    bad = [r for r in rows if "error" in r or not r.get("fits_smem", True) or (r.get("spill_store_bytes") or 0) > 0]
    print(f"{len(rows)} configs compiled for sm_90; {len(bad)} failing, over shared memory, or spilling")
    if args.out:
        args.out.write_text(json.dumps({"target": "sm_90 (compile only, no GPU)", "triton": triton.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
