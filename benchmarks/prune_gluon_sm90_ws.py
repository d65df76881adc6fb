"""CPU-side prune of the Gluon block-scale kernel's tunable space (issue 40), before any GPU time.

    python benchmarks/prune_gluon_sm90_ws.py --ablations --card triton_fp8_blockscale_gemm_sm90 \\
        --out-dir kernels/skillrun_kernels/fp8_blockscale_gemm/results

Compiles, for sm_90a with Triton's bundled ptxas (no GPU), every ``gluon_sm90_ws.ABLATIONS`` variant
(``--ablations``) and every config of each ``tunable_kernels`` space of the card that names
``gluon_sm90_ws`` (``--card``; the space enumerated exactly as ``skill-run tune`` enumerates it, with
its constraints, at each recipe's representative shape), and holds each to
``gluon_sm90_ws.prune_reasons``: spills or local memory, ptxas serialising the wgmma (C7514/C7515),
a promote that no longer overlaps a pending wgmma group where the config asks for one, shared
memory over 227 KB, a ring barrier indexed from outside its loop, and, for the 2x1 cluster, shared-
memory offsets or a tensor-map parameter the inline PTX would get wrong. Writes

* ``gluon_sm90_ws_<commit>_compile_only.json``: the full compile facts of every ablation variant;
* ``gluon_sm90_ws_<commit>_prune.json``: per recipe, the configs kept and those dropped with the reason.

Compile-only facts: nothing here is a measurement. Exit status 1 when a config of a card space is
dropped (a card must not send a config the prune rejects to the device), 0 otherwise.
``skill-run tune --compile-only`` prunes FlyDSL spaces only (runner/skillrun/tune/prune.py); this
script is the sm_90 Gluon counterpart until the engine takes a port's ``prune_reasons``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULE = "skillrun_kernels.fp8_blockscale_gemm.gluon_sm90_ws"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              check=False, cwd=REPO).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def card_spaces(card_id: str) -> list[dict]:
    """(recipe, shape, start config, configs) of every tunable_kernels entry naming gluon_sm90_ws."""
    from skillrun.check.core import representative_shape
    from skillrun.kb import tunable as T
    from skillrun.kb.index import SkillIndex

    idx = SkillIndex.load()
    card = idx.skill(card_id)
    facts = idx.device_facts("sm_90")
    out = []
    for r in card.recipes:
        for ks in T.kernel_spaces_of(card, r.name):
            if not ks.kernel.startswith(MODULE + ":"):
                continue
            shape = representative_shape(card, r, "sm_90")
            configs, pruned = T.enumerate_candidates(dict(ks.config), ks.space, shape, facts)
            out.append({"recipe": r.name, "shape": shape, "start": dict(ks.config), "configs": configs,
                        "constraint_pruned": [{"config": c, "reason": why} for c, why in pruned]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ablations", action="store_true", help="compile every gluon_sm90_ws.ABLATIONS variant")
    ap.add_argument("--card", default=None, help="prune this card's gluon_sm90_ws tunable_kernels spaces")
    ap.add_argument("--out-dir", type=Path, default=None, help="write the JSON files here")
    args = ap.parse_args()
    import triton

    from skillrun_kernels.fp8_blockscale_gemm import gluon_sm90_ws as w

    commit = _commit()
    head = {"target": "sm_90a", "triton": triton.__version__, "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    facts_cache: dict[str, dict] = {}

    def facts_of(cfg: dict) -> dict:
        key = json.dumps(w.Config.from_dict(cfg).as_dict(), sort_keys=True)
        if key not in facts_cache:
            t0 = time.time()
            try:
                facts_cache[key] = w.compile_only(None, cfg)
            except Exception as exc:  # noqa: BLE001 - a compile failure is a reason, recorded
                facts_cache[key] = {"config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            print(f"[compile] {key} {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
        return facts_cache[key]

    def verdict(cfg: dict) -> dict:
        try:
            w.Config.from_dict(cfg).check()
        except ValueError as exc:
            return {"config": cfg, "kept": False, "reason": f"check: {exc}"}
        f = facts_of(cfg)
        if "error" in f:
            return {"config": cfg, "kept": False, "reason": f"compile failed: {f['error']}"}
        why = w.prune_reasons(f)
        return {"config": cfg, "kept": not why, "reason": "; ".join(why), "facts": w.compact(f)}

    rc = 0
    if args.ablations:
        rows = []
        for name, knobs in w.ABLATIONS.items():
            v = verdict(knobs)
            f = facts_cache.get(json.dumps(w.Config.from_dict(knobs).as_dict(), sort_keys=True), {})
            rows.append({"variant": name, "kept": v["kept"], "prune_reason": v["reason"], **f})
            print(json.dumps({"variant": name, "kept": v["kept"], "reason": v["reason"][:160],
                              **{k: f.get(k) for k in ("regs", "spill_store_bytes", "shared_bytes",
                                                       "ptxas_wgmma_serialized", "sass_ffma_while_qgmma_pending",
                                                       "sass_utmaldg_multicast")}}), flush=True)
        if args.out_dir:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            (args.out_dir / f"gluon_sm90_ws_{commit}_compile_only.json").write_text(json.dumps({
                "what": "compile only, no GPU: static facts of gluon_sm90_ws for sm_90a and the CPU prune's verdict "
                        "(nothing here is a measurement)", **head, "rows": rows}, indent=1) + "\n")
    if args.card:
        spaces = []
        for sp in card_spaces(args.card):
            verdicts = [verdict(c) for c in sp["configs"]]
            dropped = [v for v in verdicts if not v["kept"]]
            if dropped:
                rc = 1
            spaces.append({**{k: sp[k] for k in ("recipe", "shape", "start", "constraint_pruned")},
                           "kept": [v["config"] for v in verdicts if v["kept"]],
                           "dropped": [{"config": v["config"], "reason": v["reason"]} for v in dropped],
                           "facts": [v for v in verdicts if "facts" in v]})
            print(f"{sp['recipe']}: {len(verdicts) - len(dropped)} of {len(verdicts)} configs kept"
                  + "".join(f"\n  dropped {v['config']}: {v['reason'][:200]}" for v in dropped), flush=True)
        if args.out_dir:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            (args.out_dir / f"gluon_sm90_ws_{commit}_prune.json").write_text(json.dumps({
                "what": "compile-only prune of the card's gluon_sm90_ws tunable spaces (no GPU): a config that spills, "
                        "is serialised by ptxas, loses its overlap or breaks the cluster checks is dropped before "
                        "any device time; nothing here is a measurement", **head, "card": args.card,
                "spaces": spaces}, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
