"""Compile a Triton kernel for sm_90a on this machine (no GPU) and read what its speed depends on.

Every Triton sm_90 port's ``compile_only(shape, config, arch)`` (kernels/protocol.py) resolves its
config as ``build`` would, then hands each launched GEMM kernel here. Triton 3.6 compiles to PTX and
cubin; its bundled ptxas, run again with ``-v``, reports registers and spills, and also its verdict
on the wgmma pipeline (C7514/C7515: every wgmma serialised). The facts are static: nothing here
says how fast a kernel runs.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

SM90_SMEM_LIMIT = 232448  # bytes per block, the opt-in maximum on sm_90
DIV16 = [["tt.divisibility", 16]]


def capability(arch: str) -> int:
    """90 from "sm_90" or "sm_90a"; a clear error for anything else."""
    m = re.fullmatch(r"sm_(\d+)a?", arch)
    if not m:
        raise ValueError(f"arch must look like 'sm_90a', got {arch!r}")
    return int(m.group(1))


def compile_kernel(fn, *, types: dict[str, str], constexprs: dict[str, Any], divisible: tuple[str, ...] | list[str] = (),
                   values: dict[str, int] | None = None, num_warps: int, num_stages: int, arch: str = "sm_90a"):
    """``triton.compile`` of one ``@triton.jit`` function for ``arch``.

    ``types``: Triton type strings of the runtime arguments ("*fp8e4nv", "i64"); an argument in
    neither ``types`` nor ``constexprs`` is an ``i32``. ``divisible``: arguments always 16-aligned
    (the launcher's tensor pointers); ``values``: integer arguments at the shape compiled for, which
    the JIT specialises at launch as here: a 1 becomes the constant 1, a multiple of 16 is marked
    divisible, except for the kernel's ``do_not_specialize`` arguments.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    values = values or {}
    unknown = sorted((set(types) | set(constexprs) | set(divisible) | set(values)) - set(names))
    if unknown:
        raise ValueError(f"{fn.__name__} has no arguments {unknown}")
    fixed = {names[x] if isinstance(x, int) else x for x in getattr(fn, "do_not_specialize", None) or ()}
    special = {n: int(v) for n, v in values.items() if n not in constexprs and n not in fixed}
    constexprs = {**constexprs, **{n: 1 for n, v in special.items() if v == 1}}
    divisible = [*divisible, *(n for n, v in special.items() if v != 1 and v % 16 == 0)]
    sig = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    attrs = {(names.index(n),): DIV16 for n in divisible}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", capability(arch), 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def ptxas_facts(ptx: str, arch: str = "sm_90a", timeout_s: float = 300) -> dict[str, Any]:
    """Registers, spills, stack and the wgmma-serialisation verdict from ``ptxas -v`` on ``ptx``."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run([str(ptxas), f"-arch=sm_{capability(arch)}a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, timeout=timeout_s, check=False)
    text = res.stdout + res.stderr
    if res.returncode != 0:
        raise RuntimeError(f"ptxas failed (exit {res.returncode}): {text[-600:]}")
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    stack = re.search(r"(\d+) bytes stack frame", text)
    return {
        "regs": int(regs.group(1)) if regs else None,
        "spill_store_bytes": int(spill.group(1)) if spill else None,
        "spill_load_bytes": int(spill.group(2)) if spill else None,
        "stack_bytes": int(stack.group(1)) if stack else None,
        "ptxas_wgmma_serialized": sorted(set(re.findall(r"C751[45]", text))),
    }


def kernel_facts(ck, name: str, arch: str = "sm_90a", compile_s: float | None = None) -> dict[str, Any]:
    """The facts of one compiled kernel: shared memory (and whether it fits a block), the tensor-core
    instructions its PTX uses (wgmma on Hopper tiles, mma.sync on small-M ones) and ptxas's report."""
    ptx = ck.asm["ptx"]
    shared = int(ck.metadata.shared)
    facts: dict[str, Any] = {
        "name": name,
        "shared_bytes": shared,
        "fits_smem": shared <= SM90_SMEM_LIMIT,
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "mma_sync": len(re.findall(r"\bmma\.sync", ptx)),
        **ptxas_facts(ptx, arch),
    }
    if compile_s is not None:
        facts["compile_s"] = round(compile_s, 2)  # near 0 when Triton's on-disk cache served it
    return facts


def compile_facts(fn, *, arch: str = "sm_90a", **kw) -> dict[str, Any]:
    """:func:`compile_kernel` then :func:`kernel_facts`, named after the kernel function."""
    t0 = time.perf_counter()
    ck = compile_kernel(fn, arch=arch, **kw)
    return kernel_facts(ck, fn.__name__, arch, time.perf_counter() - t0)


def port_facts(module: Any, shape: dict, config: dict, arch: str = "sm_90a") -> dict[str, Any]:
    """``module.compile_only(shape, config, arch)`` in the common shape (kernels/protocol.py).

    A port whose ``compile_only`` predates that shape (the block-scale Triton port: its source is
    what its H200 artifacts were measured with, and editing it would make them stale) returns its
    facts at the top level; they are read into one ``kernels`` entry here instead."""
    facts = module.compile_only(shape, config, arch)
    if facts.get("kernels"):
        return facts
    shared = int(facts.get("shared_bytes") or 0)
    local = facts.get("local")
    kernel = {
        "name": getattr(module, "KERNEL_NAME", module.__name__.rsplit(".", 1)[-1]),
        "regs": facts.get("regs"),
        "spill_store_bytes": local, "spill_load_bytes": local, "stack_bytes": facts.get("stack"),
        "shared_bytes": shared, "fits_smem": shared <= SM90_SMEM_LIMIT,
        "wgmma": int(facts.get("wgmma") or 0), "mma_sync": None,  # not counted by the legacy facts
        "ptxas_wgmma_serialized": list(facts.get("ptxas_wgmma_serialized") or []),
    }
    return {**facts, "arch": arch, "kernels": [kernel]}
