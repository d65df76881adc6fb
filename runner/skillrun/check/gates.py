"""Static gates a recipe declares (``gates:`` in the card), applied to compiled facts.

Facts are ``compile_only``'s dict: ``{"arch", "kernels": [{name, vgpr, agpr, vgpr_spill, sgpr_spill,
scratch_bytes, lds_bytes, waves_per_simd, mfma, e8m0, ...}]}``. A port that launches several
kernels (the MoE's two stages) must pass every gate in every kernel; the reported value is the
worst one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Static LDS a workgroup may use (per CU): gfx942 64 KiB, gfx950 160 KiB.
LDS_BUDGET = {"gfx942": 64 * 1024, "gfx950": 160 * 1024}
KNOWN_GATES = ("max_vgpr_spill", "max_sgpr_spill", "max_scratch_bytes", "min_waves_per_simd", "max_lds_bytes",
               "mfma_opcodes", "e8m0_scale_pinned")


@dataclass
class GateResult:
    name: str
    passed: bool
    value: Any
    limit: Any
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _worst(kernels: list[dict], key: str, pick=max) -> tuple[Any, str]:
    vals = [(k.get(key, 0), k["name"]) for k in kernels]
    v, name = pick(vals, key=lambda t: t[0])
    return v, name


def _upper(name: str, kernels: list[dict], key: str, limit: int, what: str) -> GateResult:
    value, where = _worst(kernels, key, max)
    ok = value <= limit
    reason = f"{what} {value} <= {limit}" if ok else f"{what} {value} > {limit} in {where}"
    return GateResult(name, ok, value, limit, reason)


def evaluate(gates: dict[str, Any], facts: dict[str, Any], arch: str) -> list[GateResult]:
    kernels = facts.get("kernels") or []
    if not kernels:
        return [GateResult("compiled", False, 0, ">= 1", "the compile produced no kernel")]
    out: list[GateResult] = []
    for name, limit in gates.items():
        if name not in KNOWN_GATES:
            out.append(GateResult(name, False, None, limit, f"unknown gate {name!r}; known: {', '.join(KNOWN_GATES)}"))
        elif name == "max_vgpr_spill":
            out.append(_upper(name, kernels, "vgpr_spill", int(limit), "VGPR spills"))
        elif name == "max_sgpr_spill":
            out.append(_upper(name, kernels, "sgpr_spill", int(limit), "SGPR spills"))
        elif name == "max_scratch_bytes":
            out.append(_upper(name, kernels, "scratch_bytes", int(limit), "scratch bytes per lane"))
        elif name == "min_waves_per_simd":
            value, where = _worst(kernels, "waves_per_simd", min)
            ok = value >= int(limit)
            vg = next(k["vgpr"] for k in kernels if k["name"] == where)
            reason = (f"{value} waves/SIMD >= {limit}" if ok else
                      f"{value} waves/SIMD < {limit} in {where} (unified VGPRs {vg}: min(8, 512 // ceil8({vg})))")
            out.append(GateResult(name, ok, value, int(limit), reason))
        elif name == "max_lds_bytes":
            budget = LDS_BUDGET.get(arch)
            eff = int(limit) if budget is None else min(int(limit), budget)
            r = _upper(name, kernels, "lds_bytes", eff, "static LDS bytes")
            if budget is not None and int(limit) > budget:
                r.reason += f" (card limit {limit} capped at the {arch} budget {budget})"
            out.append(r)
        elif name == "mfma_opcodes":
            required = list(limit or [])
            missing = {k["name"]: [op for op in required if not k.get("mfma", {}).get(op)] for k in kernels}
            missing = {k: v for k, v in missing.items() if v}
            present = sorted({op for k in kernels for op in k.get("mfma", {})})
            ok = not missing
            reason = (f"all of {required} present" if ok else
                      "; ".join(f"{k} lacks {v} (has {sorted(next(x for x in kernels if x['name'] == k).get('mfma', {})) or 'no MFMA'})"
                                for k, v in missing.items()))
            out.append(GateResult(name, ok, present, required, reason))
        elif name == "e8m0_scale_pinned":
            if not limit:
                out.append(GateResult(name, True, None, False, "not required by the recipe"))
                continue
            scaled = sum(k.get("e8m0", {}).get("scaled_mfma", 0) for k in kernels)
            bad = [k for k in kernels if k.get("e8m0", {}).get("unpinned", 0)]
            if bad:
                k = bad[0]
                first = k["e8m0"]["first_unpinned"] or {}
                reason = (f"{k['e8m0']['unpinned']} of {k['e8m0']['scale_operands']} E8M0 scale operands in {k['name']} are "
                          f"not the constant 0x7f7f7f7f; e.g. line {first.get('line')}: {first.get('instruction')} "
                          f"(operand {first.get('operand')} reached by {first.get('reaching')})")
                out.append(GateResult(name, False, f"{sum(x['e8m0']['unpinned'] for x in bad)} unpinned", "all pinned", reason))
            elif scaled:
                n = sum(k["e8m0"]["scale_operands"] for k in kernels)
                out.append(GateResult(name, True, f"{n} of {n} pinned", "all pinned",
                                      f"every scale operand of {scaled} v_mfma_scale_* is a VGPR set only by v_mov_b32 0x7f7f7f7f (E8M0 1.0)"))
            else:
                out.append(GateResult(name, True, "no scaled MFMA", "all pinned",
                                      "no v_mfma_scale_* in the kernel: no E8M0 scale is applied to the data"))
    return out
