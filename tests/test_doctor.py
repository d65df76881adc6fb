"""`skill-run doctor` on a CPU-only machine, and the FlyDSL version range and compat layer."""
from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest

from skillrun import api, doctor
from skillrun_kernels._flydsl import compat, toolchain


def _gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


pytestmark = pytest.mark.skipif(_gpu(), reason="checks what doctor says on a machine without a GPU")


def _by_name(rep):
    return {c["name"]: c for c in rep["checks"]}


def test_doctor_on_cpu_says_no_gpu_and_what_that_disables(monkeypatch):
    monkeypatch.setattr(doctor, "_flydsl_compiles", lambda timeout_s: [])  # the compile is tested below
    rep = api.doctor()
    checks = _by_name(rep)
    assert rep["device"]["kind"] == "none" and "no GPU" in checks["device"]["detail"]
    assert not checks["device"]["ok"] and "timing" in checks["device"]["disables"]
    assert rep["versions"]["torch"] == metadata.version("torch")
    assert checks["cuBLAS via torch"]["ok"] is False and checks["cuBLAS via torch"]["install"]
    for name in ("mslk", "aiter / CK"):
        assert name in checks and (checks[name]["ok"] or checks[name]["install"])
    assert "device" in rep["missing"]
    lines = [t for t, _ in doctor.render_lines(rep)]
    assert any(t.startswith("MISS device: no GPU") for t in lines)
    assert any("install:" in t for t in lines)


def test_doctor_without_the_toolchain_says_what_to_install(monkeypatch):
    monkeypatch.setattr(toolchain, "missing_reason", lambda: "lld-19 is not installed")
    monkeypatch.setattr(toolchain, "find_lld", lambda: None)
    items = doctor._flydsl_compiles(5.0)
    assert [i["name"] for i in items] == ["FlyDSL compile for gfx942", "FlyDSL compile for gfx950"]
    for i in items:
        assert not i["ok"] and "apt-get install -y lld-19" in i["install"] and "skill-run check" in i["disables"]


@pytest.mark.skipif(toolchain.missing_reason() is not None, reason="needs flydsl and lld-19")
def test_doctor_compiles_a_tiny_kernel_for_each_amd_target_and_names_the_linker():
    items = doctor._flydsl_compiles(300.0)
    assert len(items) == 2
    for i in items:
        assert i["ok"], i
        assert str(toolchain.find_lld()) in i["detail"]


def test_doctor_json_is_strict_and_exits_0():
    res = subprocess.run([sys.executable, "-m", "skillrun", "doctor", "--json", "--timeout", "300"],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr
    rep = json.loads(res.stdout)
    assert rep["device"]["kind"] == "none"
    assert {"device", "torch", "triton", "flydsl"} <= set(_by_name(rep))


# ---------------------------------------------------------------------------------------- FlyDSL range
def test_tested_range():
    assert compat.in_tested_range("0.4.2") and compat.in_tested_range("0.5.0") and compat.in_tested_range("0.5.3")
    assert not compat.in_tested_range("0.4.1") and not compat.in_tested_range("0.6.0") and not compat.in_tested_range(None)


def test_pyproject_accepts_the_tested_range():
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert data["project"]["optional-dependencies"]["flydsl"] == [f"flydsl{compat.SPEC}"]


def test_compat_names_what_a_flydsl_release_lacks():
    class OldLauncher:  # a JitFunction without the compile-only entry point
        pass

    with pytest.raises(RuntimeError) as exc:
        compat.compile_only(OldLauncher(), ())
    assert "_compile_only" in str(exc.value) and compat.TESTED[0] in str(exc.value)


@pytest.mark.skipif(toolchain.missing_reason() is not None, reason="needs flydsl and lld-19")
def test_compile_facts_and_artifacts_record_the_flydsl_version(tmp_path):
    from skillrun.check import core
    from skillrun.check.flydsl_env import compile_in_child

    res = compile_in_child("skillrun_kernels._flydsl.probe:compile_only", {}, {}, "gfx950", timeout_s=300, isa_dir=tmp_path)
    assert res.ok, res.error
    assert res.facts["flydsl"] == metadata.version("flydsl")
    # The compile-only artifact carries it in its compile section (and is schema-valid).
    from skillrun.kb.cards import Recipe
    from skillrun.evidence.validation import validate_record

    idx = api.load_index()
    card = idx.skill("flydsl_fp8_blockscale_gemm")
    recipe = card.recipes[0]
    chk = core.RecipeCheck(recipe=recipe.name, kernel=recipe.kernel, shape={"M": 64, "N": 128, "K": 128},
                           config=dict(recipe.config), arch="gfx950", status="compile_verified", reason="probe",
                           kernels=res.facts["kernels"])
    rec = core._record(card, chk, recipe, res.facts["flydsl"])
    assert rec["compile"]["flydsl"] == metadata.version("flydsl")
    validate_record(rec)
    assert isinstance(recipe, Recipe)


def test_doctor_says_what_confines_the_port_here():
    from skillrun.io import sandbox

    item = doctor._sandbox()
    assert item["name"] == "sandbox" and "Landlock" in item["detail"] and "namespaces" in item["detail"]
    if sandbox.support()["level"] == "full":
        assert item["ok"] and "private /proc yes" in item["detail"] and "import path read-only yes" in item["detail"]
    else:
        assert not item["ok"] and "unsandboxed" in item["disables"]
