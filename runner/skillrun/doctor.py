"""`skill-run doctor`: what this machine can do, one line each, and what a missing piece costs.

Nothing here needs a GPU: on a CPU-only machine the device line says "no GPU". Versions are read
from package metadata (no heavy import); torch is imported once to see the device; the FlyDSL
check compiles a tiny real kernel (:mod:`skillrun_kernels._flydsl.probe`) for each AMD target in
a child process with a time limit, through the same path as `skill-run check`.
"""
from __future__ import annotations

import importlib.util
import platform
import sys
from importlib import metadata
from typing import Any, Optional

from skillrun.options import FLYDSL_ARCHS

FLYDSL_TESTED = ("0.4.2", "0.5.x")  # the range CI compiles the FlyDSL kernels with (oldest, newest)


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _item(name: str, ok: bool, detail: str, disables: str = "", install: str = "") -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail, "disables": "" if ok else disables, "install": "" if ok else install}


def _device() -> tuple[dict[str, Any], Any]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch is reported, not raised
        return {"kind": "none", "detail": f"no GPU (torch not importable: {type(exc).__name__})"}, None
    try:
        has = bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        has = False
    if not has:
        return {"kind": "none", "detail": "no GPU (torch sees no CUDA or ROCm device)"}, torch
    props = torch.cuda.get_device_properties(0)
    hip = getattr(torch.version, "hip", None)
    arch = (str(getattr(props, "gcnArchName", "")).split(":")[0] or None) if hip else f"sm_{props.major}{props.minor}"
    n = torch.cuda.device_count()
    return {"kind": "rocm" if hip else "cuda", "name": props.name, "arch": arch, "count": n,
            "runtime": f"HIP {hip}" if hip else f"CUDA {torch.version.cuda}",
            "detail": f"{n}× {props.name} ({arch}), {'HIP ' + str(hip) if hip else 'CUDA ' + str(torch.version.cuda)}"}, torch


def _flydsl_compiles(timeout_s: float) -> list[dict[str, Any]]:
    from skillrun_kernels._flydsl import toolchain

    out = []
    reason = toolchain.missing_reason()
    lld = toolchain.find_lld()
    for arch in FLYDSL_ARCHS:
        name = f"FlyDSL compile for {arch}"
        if reason:
            install = []
            if lld is None:
                install.append("apt-get install -y lld-19")
            if toolchain.flydsl_version() is None:
                install.append("pip install 'skillrun[flydsl]'")
            out.append(_item(name, False, f"cannot compile here: {reason}",
                             f"`skill-run check` and compile-only evidence for {arch}", " && ".join(install)))
            continue
        from skillrun.check.flydsl_env import compile_in_child

        res = compile_in_child("skillrun_kernels._flydsl.probe:compile_only", {}, {}, arch, timeout_s=timeout_s)
        if res.ok:
            out.append(_item(name, True, f"a test kernel compiled in {res.seconds:.1f} s (linker {lld})"))
        else:
            out.append(_item(name, False, f"the test kernel did not compile: {res.error} (linker {lld})",
                             f"`skill-run check` for {arch}",
                             f"pip install 'flydsl>={FLYDSL_TESTED[0]},<0.6' (tested {FLYDSL_TESTED[0]} to {FLYDSL_TESTED[1]})"))
    return out


def _sandbox() -> dict[str, Any]:
    """What confines the port's process here (skillrun.io.sandbox), entered in a throw-away child and checked."""
    from skillrun.io import sandbox

    rep = sandbox.probe()
    sup = rep["support"]
    held = rep.get("held", {}).get("checks") or {}
    detail = (f"{sandbox.describe(sup)}; seccomp {'available' if sup['seccomp'] else 'absent'} (not used)"
              f"{'; bubblewrap at ' + sup['bwrap'] if sup['bwrap'] else ''}")
    if held:
        detail += "; checked in a child: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in held.items())
    ok = sup["level"] == "full" and not rep["problems"]
    if rep["problems"]:
        detail += "; did not hold: " + ", ".join(rep["problems"])
    return _item("sandbox", ok, detail,
                 "confinement of the port's process: runs here are recorded as unsandboxed (the port can write the "
                 "knowledge base, see other processes and outlive the run)",
                 "Linux >= 5.13 with Landlock in the LSM list and unprivileged user namespaces "
                 "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
                 "kernel.apparmor_restrict_unprivileged_userns=0)")


def _references(dev: dict[str, Any], torch: Any) -> list[dict[str, Any]]:
    refs = []
    cuda_built = bool(torch is not None and getattr(torch.version, "cuda", None))
    hip_built = bool(torch is not None and getattr(torch.version, "hip", None))
    scaled = bool(torch is not None and hasattr(torch, "_scaled_mm"))
    if cuda_built and scaled:
        detail = "torch._scaled_mm present (torch built with CUDA " + str(torch.version.cuda) + ")"
        if dev["kind"] != "cuda":
            detail += "; no NVIDIA GPU here, so it cannot run"
        refs.append(_item("cuBLAS via torch", dev["kind"] == "cuda", detail,
                          "the cuBLAS baseline for sm_90 block-scale runs", "an NVIDIA GPU with a CUDA build of torch"))
    else:
        refs.append(_item("cuBLAS via torch", False,
                          "torch is not a CUDA build" if torch is not None else "torch is not installed",
                          "the cuBLAS baseline for sm_90 block-scale runs (runs on an NVIDIA GPU only)",
                          "pip install torch (a CUDA build, on an NVIDIA machine)"))
    has_mslk = importlib.util.find_spec("mslk") is not None
    refs.append(_item("mslk", has_mslk, f"mslk {_version('mslk') or _version('mslk-cuda') or ''} importable".strip()
                      if has_mslk else "not importable",
                      "MSLK CUTLASS references for batched row-wise and bf16×int4 grouped GEMM (sm_90; ROCm)",
                      "pip install mslk-cuda (NVIDIA) or mslk (ROCm)"))
    has_aiter = importlib.util.find_spec("aiter") is not None
    refs.append(_item("aiter / CK", has_aiter and hip_built,
                      (f"aiter {_version('aiter') or ''} importable".strip() + ("" if hip_built else "; torch is not a ROCm build"))
                      if has_aiter else "not importable" + ("" if hip_built else " (needs ROCm)"),
                      "the production CK/aiter baselines on gfx942/gfx950 (torch is used instead, and the artifact says so)",
                      "pip install aiter on a ROCm machine (see ROCm/aiter)"))
    return refs


def diagnose(flydsl_timeout_s: float = 120.0) -> dict[str, Any]:
    dev, torch = _device()
    versions = {"python": platform.python_version(), "skillrun": _version("skillrun"),
                "torch": _version("torch"), "triton": _version("triton"), "flydsl": _version("flydsl")}
    items = [_item("device", dev["kind"] != "none", dev["detail"],
                   "timing, speedups and GPU validation (CPU numerics and compile-only checks still work)",
                   "run on a machine with an NVIDIA (sm_90) or AMD (gfx942/gfx950) GPU")]
    items.append(_item("torch", versions["torch"] is not None, f"torch {versions['torch']}" if versions["torch"] else "not installed",
                       "running ports, references and CPU numerics", "pip install 'skillrun[kernels]'"))
    items.append(_item("triton", versions["triton"] is not None, f"triton {versions['triton']}" if versions["triton"] else "not installed",
                       "the Triton ports (sm_90) and their CPU interpreter checks", "pip install 'skillrun[kernels]'"))
    fv = versions["flydsl"]
    fl_ok = fv is not None
    fl_detail = f"flydsl {fv}" if fv else "not installed"
    if fv and not _in_tested_range(fv):
        fl_detail += f" (outside the tested range {FLYDSL_TESTED[0]} to {FLYDSL_TESTED[1]})"
    items.append(_item("flydsl", fl_ok, fl_detail, "the FlyDSL ports (gfx942/gfx950) and `skill-run check`",
                       "pip install 'skillrun[flydsl]'"))
    items += _flydsl_compiles(flydsl_timeout_s)
    items.append(_sandbox())
    items += _references(dev, torch)
    return {"device": dev, "versions": versions, "checks": items,
            "missing": [i["name"] for i in items if not i["ok"]], "platform": f"{platform.system()} {platform.machine()}",
            "executable": sys.executable}


def _in_tested_range(v: str) -> bool:
    parts = v.split(".")
    try:
        major, minor, patch = int(parts[0]), int(parts[1]), int("".join(c for c in parts[2] if c.isdigit()) or 0) if len(parts) > 2 else 0
    except (ValueError, IndexError):
        return False
    return (major, minor, patch) >= (0, 4, 2) and (major, minor) <= (0, 5)


def render_lines(rep: dict[str, Any]) -> list[tuple[str, str]]:
    """(text, style) lines for the terminal: one per check, then what each missing piece disables."""
    lines = []
    for i in rep["checks"]:
        mark = "ok  " if i["ok"] else "MISS"
        lines.append((f"{mark} {i['name']}: {i['detail']}", "" if i["ok"] else "yellow"))
    missing = [i for i in rep["checks"] if not i["ok"]]
    if missing:
        lines.append(("", ""))
        lines.append(("What is missing disables:", "bold"))
        for i in missing:
            lines.append((f"  {i['name']}: {i['disables']}" + (f" — install: {i['install']}" if i["install"] else ""), ""))
    return lines
