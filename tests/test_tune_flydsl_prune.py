"""`skill-run tune --compile-only` on a FlyDSL card: the space is pruned on the CPU by the static gates.

Real compiles (FlyDSL + lld-19; skipped with a reason when missing). The space is kept to two
configs because each compile takes a while: waves_per_eu 2 (the recipe) and 3 (spills on gfx950).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from skillrun.kb.index import SkillIndex
from skillrun.evidence.tuning_artifact import load_tuning_artifact
from skillrun.tune.sweep import tune_shape

REPO = Path(__file__).resolve().parents[1]
CARD = "flydsl_fp8_blockscale_gemm"


def _toolchain() -> str | None:
    try:
        from skillrun.check.flydsl_env import require_toolchain

        require_toolchain()
    except Exception as exc:  # noqa: BLE001 - any missing piece is a skip reason
        return str(exc)
    return None


@pytest.mark.slow
def test_compile_only_prunes_the_spilling_config_with_the_gate_reason(tmp_path):
    why = _toolchain()
    if why:
        pytest.skip(f"FlyDSL toolchain not available: {why}")
    root = tmp_path / "kb"
    for sub in ("schemas", "facts"):
        shutil.copytree(REPO / sub, root / sub)
    (root / "skills" / CARD).mkdir(parents=True)
    text = (REPO / "skills" / CARD / "SKILL.md").read_text()
    full = "space: {tile_n: [128, 256], xcd_swizzle: [0, 8], waves_per_eu: [2, 3]}"
    assert full in text
    (root / "skills" / CARD / "SKILL.md").write_text(text.replace(full, "space: {waves_per_eu: [2, 3]}"))
    index = SkillIndex.load(root)
    shape = {"M": 256, "N": 4096, "K": 1536}  # no shape class covers it: UNTUNED, starts from untuned_4wave
    rec = tune_shape(index, CARD, shape, compile_only=True, arch="gfx950", timeout_s=900,
                     validation_root=root / "validation")
    assert rec["kind"] == "compile_prune" and rec["verdict"] == "pruned"
    rows = {r["config"]["waves_per_eu"]: r for r in rec["candidates"]}
    assert rows[2]["status"] == "compile_verified", rows[2]["reason"]
    spilled = rows[3]
    assert spilled["status"] == "gate_failed"
    assert "max_vgpr_spill" in spilled["reason"] and "VGPR spills" in spilled["reason"]
    assert spilled["compile"]["kernels"][0]["vgpr_spill"] > 0
    art = load_tuning_artifact(Path(rec["artifact"]))
    assert "not a measurement" in art["reason"]
