"""Compile-only facts and byte/issue models of the MoE decode variants (issue 41), on a CPU.

For each decode shape of the issue and each named variant of the decode modules (their ``ABLATIONS``),
plus the incumbent recipe kernel the H200 measured, this compiles every GEMM/GEMV kernel for sm_90a
(Triton 3.6 and its ptxas) and reads, besides registers, spills and shared memory, the SASS of the
kernel's hot loop (nvdisasm): instructions per iteration by opcode class and warp-instructions per
weight streamed. Two model times per call follow, both lower bounds, neither a measurement:

- ``roof_us``: the call's compulsory DRAM bytes (traffic.py) at the copy roof (4.25 TB/s, the H200's
  measured 4.2-4.3 TB/s);
- ``issue_us``: the time the 132 SMs need to issue the hot loops over every weight the call streams,
  at one warp-instruction per scheduler per clock and the 1.98 GHz boost clock (no stalls, nothing
  outside the loops counted).

A variant whose ``issue_us`` is above its ``roof_us`` cannot reach the roof whatever its memory
pipeline does; the ratio of the two is what the levers move. Output: one JSON per family
(``kernels/skillrun_kernels/<family>/compile_sm90_decode.json``) and a table on stdout.

    python benchmarks/issue41_decode_facts.py                 # both families, every variant
    python benchmarks/issue41_decode_facts.py --family fp8 --variant base --variant t16
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
A16_SHAPES = [
    {"tokens": 1, "model_dim": 7168, "inter_dim": 512, "experts": 384, "topk": 8, "group_size": 128},
    {"tokens": 1, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 128},
    {"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 128},
    {"tokens": 16, "model_dim": 7168, "inter_dim": 512, "experts": 384, "topk": 8, "group_size": 128},
]
FP8_SHAPES = [{"tokens": t, "model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8} for t in (1, 16)]
# the recipe each shape selects on the card (tests.selects), for the incumbent's row
A16_RECIPE = {(1, 384, 512): "decode_tiny_i512", (1, 64, 2048): "decode_tiny_i2048", (16, 64, 2048): "decode",
              (16, 384, 512): "decode"}


def _commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=False)
    return res.stdout.strip() or "unknown"


def _patched_incumbent_facts():
    """The incumbent ports call ``_triton.compile.compile_facts`` at run time: route it through the
    SASS-reading variant (weights per iteration from the kernel's tile constexprs) without editing them."""
    from skillrun_kernels._triton import compile as tc, sass

    def facts(fn, **kw):
        c = kw.get("constexprs", {})
        per = c.get("BLOCK_N", 0) * c.get("BLOCK_K", 0) * (2 if "gate_up" in fn.__name__ else 1)
        return sass.compile_facts_with_loop(fn, weights_per_iteration=per or None, **kw)

    tc.compile_facts = facts


def issue_us(kernels: list[dict], cfg: dict, shape: dict, family: str) -> float | None:
    """Issue time of the hot loops over the call's weights (module docstring); None without loop facts."""
    from skillrun_kernels._triton import sass

    if family == "a16wi4":
        from skillrun_kernels.moe_a16wi4 import problem
        t, d, i, _e, k, _g = problem.dims(shape)
    else:
        from skillrun_kernels.fp8_blockscale_moe import problem
        t, d, i, _e, k = problem.dims(shape)
    act = problem.expected_active_experts(shape)
    total = 0.0
    for kn in kernels:
        hl = kn.get("hot_loop")
        if not hl or not hl.get("weights_per_iteration"):
            return None
        warps = kn["num_warps"]
        name = kn["name"]
        if "fused" in name:
            total += sass.issue_floor_us(act * 2 * i * d, hl["instructions"], warps, hl["weights_per_iteration"])
            loops = kn.get("mma_loops") or []
            if len(loops) > 1:  # the down part: BLOCK_N2 x (BLOCK_N1 or 128) weights per iteration
                kk = cfg.get("BLOCK_N1", 128) if family == "a16wi4" else 128
                total += sass.issue_floor_us(act * d * i, loops[-1]["instructions"], warps, cfg["BLOCK_N2"] * kk)
        elif "gate_up" in name:
            total += sass.issue_floor_us(act * 2 * i * d, hl["instructions"], warps, hl["weights_per_iteration"])
        elif "down_token" in name:
            total += sass.issue_floor_us(t * k * d * i, hl["instructions"], warps, hl["weights_per_iteration"])
        else:
            total += sass.issue_floor_us(act * d * i, hl["instructions"], warps, hl["weights_per_iteration"])
    return total


def rows_for(family: str, variants: list[str] | None) -> list[dict]:
    import importlib

    from skillrun.kb.index import SkillIndex

    if family == "a16wi4":
        dec = importlib.import_module("skillrun_kernels.moe_a16wi4.triton_sm90_decode")
        inc = importlib.import_module("skillrun_kernels.moe_a16wi4.triton_sm90")
        traffic = importlib.import_module("skillrun_kernels.moe_a16wi4.traffic")
        card = SkillIndex.load().skill("triton_moe_a16wi4_sm90")
        shapes = A16_SHAPES
    else:
        dec = importlib.import_module("skillrun_kernels.fp8_blockscale_moe.triton_sm90_decode")
        inc = importlib.import_module("skillrun_kernels.fp8_blockscale_moe.triton_sm90")
        traffic = importlib.import_module("skillrun_kernels.fp8_blockscale_moe.traffic")
        card = SkillIndex.load().skill("triton_moe_fp8_blockscale_sm90")
        shapes = FP8_SHAPES
    rows = []
    for shape in shapes:
        jobs = []
        if family == "a16wi4":
            recipe = A16_RECIPE[(shape["tokens"], shape["experts"], shape["inter_dim"])]
        else:
            recipe = "decode"
        if not variants or "incumbent" in variants:
            jobs.append(("incumbent", inc, dict(card.recipe(recipe).config), recipe))
        for name, cfg in dec.ABLATIONS.items():
            if not variants or name in variants:
                jobs.append((name, dec, cfg, None))
        for name, mod, cfg, rec in jobs:
            row = {"variant": name, "shape": shape, "kernel_module": mod.__name__}
            if rec:
                row["recipe"] = rec
            t0 = time.perf_counter()
            try:
                facts = mod.compile_only(shape, cfg, "sm_90a")
            except Exception as exc:  # noqa: BLE001 - report and keep going
                row["error"] = f"{type(exc).__name__}: {str(exc)[-300:]}"
                rows.append(row)
                continue
            full = facts.get("config", cfg)
            warps = [full.get("warps1"), full.get("warps2")]
            for j, kn in enumerate(facts["kernels"]):
                kn["num_warps"] = warps[min(j, 1)]
            tr = traffic.bytes_moved(shape, full if name != "incumbent" else None).as_dict()
            for kn in facts["kernels"]:  # the opcode classes say enough; the top-12 list is for a reader's session
                (kn.get("hot_loop") or {}).pop("top_ops", None)
            tr = {k: tr[k] for k in ("hbm_bytes", "reread_bytes", "l2_bytes", "counts", "roof_us", "model_us")}
            row.update(config=full, launches=facts.get("launches", 5), kernels=facts["kernels"], traffic=tr,
                       roof_us=tr["roof_us"], model_us=tr["model_us"],
                       issue_us=issue_us(facts["kernels"], full, shape, family), compile_s=round(time.perf_counter() - t0, 1))
            rows.append(row)
    return rows


def print_rows(rows: list[dict]) -> None:
    print(f"{'shape':<26} {'variant':<16} {'L':>2} {'regs':>9} {'spill':>5} {'smem KB':>9} {'mma':>9} "
          f"{'wi/weight':>11} {'roof us':>8} {'issue us':>9}")
    for r in rows:
        s = r["shape"]
        tag = f"T{s['tokens']} E{s['experts']} I{s['inter_dim']}"
        if "error" in r:
            print(f"{tag:<26} {r['variant']:<16} ERROR {r['error'][:120]}")
            continue
        ks = r["kernels"]
        regs = "/".join(str(k["regs"]) for k in ks)
        spill = max(k["spill_store_bytes"] or 0 for k in ks)
        smem = "/".join(str(k["shared_bytes"] // 1024) for k in ks)
        mma = "/".join("wg" if k["wgmma"] else ("sync" if k["mma_sync"] else "fma") for k in ks)
        wi = "/".join(f"{(k.get('hot_loop') or {}).get('warp_insts_per_weight', float('nan')):.3f}" for k in ks)
        iu = r["issue_us"]
        print(f"{tag:<26} {r['variant']:<16} {r['launches']:>2} {regs:>9} {spill:>5} {smem:>9} {mma:>9} {wi:>11} "
              f"{r['roof_us']:>8.1f} {iu if iu is None else round(iu, 1):>9}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=["a16wi4", "fp8", "both"], default="both")
    ap.add_argument("--variant", action="append", default=None, help="only these variants ('incumbent' included by name)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    import triton

    _patched_incumbent_facts()
    for fam in (["a16wi4", "fp8"] if args.family == "both" else [args.family]):
        rows = rows_for(fam, args.variant)
        print_rows(rows)
        if not args.no_write:
            folder = "moe_a16wi4" if fam == "a16wi4" else "fp8_blockscale_moe"
            out = ROOT / "kernels" / "skillrun_kernels" / folder / "compile_sm90_decode.json"
            head = {"what": "compile only, no GPU: static facts for sm_90a and lower-bound models (roof_us: compulsory "
                            "DRAM bytes at 4.25 TB/s; issue_us: hot-loop instructions at 4 warp-instructions per SM "
                            "per clock, 132 SMs, 1.98 GHz). Nothing here is a measurement.",
                    "target": "sm_90a", "triton": triton.__version__, "commit": _commit(),
                    "command": "python benchmarks/issue41_decode_facts.py",
                    "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
            body = ",\n".join(json.dumps(r, separators=(",", ":")) for r in rows)  # one row per line
            out.write_text(json.dumps(head, indent=1)[:-2] + ',\n "rows": [\n' + body + "\n]}\n")
            print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
