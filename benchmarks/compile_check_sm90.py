"""Compile-only check of every card's sm_90 Triton/Gluon recipes on a machine without a GPU.

For each recipe of each card whose backend is Triton or Gluon and whose gens include sm_90, calls
its port module's ``compile_only(shape, config, arch)`` (kernels/skillrun_kernels/protocol.py) and reports, per
launched GEMM kernel, shared memory (and whether it fits sm_90's 227 KB per block), registers and
spills (Triton's bundled ptxas -v), wgmma vs mma.sync, and ptxas's wgmma-serialisation verdict.
It catches recipes that cannot compile, cannot launch or spill before device time is spent.
Compile-only facts: they say nothing about speed. A new card or port is picked up without edits.

    python benchmarks/compile_check_sm90.py --out sm90_compile.json          # every card, representative shapes
    python benchmarks/compile_check_sm90.py --card triton_moe_a16wi4_sm90 --ci  # one card at its family's CI shape
    python benchmarks/compile_check_sm90.py --kernel skillrun_kernels.fp8_rowwise_batched_gemm.triton_sm90_splitk \\
        --shape '{"batch": 16, "M": 16, "N": 1280, "K": 8192}' --config '{"BLOCK_K": 128}' --config '{"num_stages": 5}'
    python benchmarks/compile_check_sm90.py --kernel skillrun_kernels.fp8_blockscale_gemm.gluon_sm90 \\
        --out kernels/skillrun_kernels/fp8_blockscale_gemm/results/gluon_sm90_<commit>_compile_only.json

``--kernel`` compiles one port module outside any card (a sweep's candidates, a port before its
card): each ``--config`` at ``--shape``, or, without ``--config``, the module's ``ABLATIONS``
(name -> config) when it has them. Exit status 1 when any kernel fails to compile, does not fit
shared memory, spills or is serialised by ptxas.
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import time
from pathlib import Path

ARCH = "sm_90a"
BACKENDS = ("triton", "gluon")


def sm90_recipes(card_ids: list[str] | None, ci: bool) -> list[dict]:
    """(card, recipe, module, shape, config) of every sm_90 Triton/Gluon recipe, in card order."""
    from skillrun.check.core import representative_shape
    from skillrun.kb.index import SkillIndex

    idx = SkillIndex.load()
    cards = [idx.skill(c) for c in card_ids] if card_ids else list(idx.skills.values())
    jobs = []
    for card in cards:
        problem = importlib.import_module(card.references["problem"])
        for r in card.recipes:
            if r.backend not in BACKENDS or not any(g.startswith("sm_90") for g in r.gens):
                continue
            shape = representative_shape(card, r, "sm_90")
            if ci or shape is None:
                shape = problem.ci_shape(shape)
            jobs.append({"card": card.id, "recipe": r.name, "module": r.kernel.split(":")[0], "shape": shape,
                         "config": dict(r.config)})
    return jobs


def kernel_jobs(module: str, shape: dict | None, configs: list[dict]) -> list[dict]:
    """One job per config of a port module named on the command line (its ABLATIONS when none given)."""
    if not configs:
        ablations = getattr(importlib.import_module(module), "ABLATIONS", None)
        if not ablations:
            raise SystemExit(f"{module}: pass --config (the module has no ABLATIONS to compile)")
        return [{"variant": name, "module": module, "shape": shape, "config": cfg} for name, cfg in ablations.items()]
    return [{"module": module, "shape": shape, "config": cfg} for cfg in configs]


def run(job: dict) -> list[dict]:
    """Rows (one per compiled kernel) for one job; a failure is one row with its error."""
    head = {k: job[k] for k in ("card", "recipe", "variant") if k in job}
    try:
        mod = importlib.import_module(job["module"])
        if not callable(getattr(mod, "compile_only", None)):
            raise TypeError(f"{job['module']} has no compile_only(shape, config, arch) (kernels/skillrun_kernels/protocol.py)")
        from skillrun_kernels._triton.compile import port_facts

        facts = port_facts(mod, job["shape"], job["config"], ARCH)
        config = facts.get("config", job["config"])
        return [{**head, "shape": job["shape"], "config": config, **k} for k in facts["kernels"]]
    except Exception as exc:  # noqa: BLE001 - every port is untrusted input: report it, keep going
        return [{**head, "shape": job["shape"], "config": job["config"],
                 "error": f"{type(exc).__name__}: {str(exc)[-400:]}"}]


def is_bad(row: dict) -> bool:
    return ("error" in row or not row.get("fits_smem", True) or (row.get("spill_store_bytes") or 0) > 0
            or bool(row.get("ptxas_wgmma_serialized")))


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=False,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--card", action="append", default=None, help="only this card (repeatable; default: every card)")
    ap.add_argument("--ci", action="store_true", help="compile at each family's problem.ci_shape, not the representative shape")
    ap.add_argument("--kernel", help="a port module (outside any card) to compile instead of the cards' recipes")
    ap.add_argument("--shape", type=json.loads, default=None, help="--kernel: the shape, as JSON")
    ap.add_argument("--config", type=json.loads, action="append", default=[], help="--kernel: a config, as JSON (repeatable)")
    ap.add_argument("--out", type=Path, default=None, help="write every row here as JSON")
    args = ap.parse_args()
    import triton

    jobs = kernel_jobs(args.kernel, args.shape, args.config) if args.kernel else sm90_recipes(args.card, args.ci)
    rows = []
    for job in jobs:
        for row in run(job):
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("config", "shape")}), flush=True)
    bad = [r for r in rows if is_bad(r)]
    print(f"{len(jobs)} configs compiled for {ARCH} ({len(rows)} kernel rows); {len(bad)} rows failing, over shared "
          f"memory, spilling or serialised by ptxas")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "what": f"compile only, no GPU: static facts for {ARCH} (nothing here is a measurement)",
            "target": ARCH, "triton": triton.__version__, "commit": _commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "rows": rows}, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
