"""The hot loop of a compiled sm_90 kernel, read from its SASS on a CPU (Triton's bundled nvdisasm).

A decode MoE kernel that streams int4 or fp8 weights can be limited by instruction issue before the
memory roof: every weight is unpacked, converted, scaled and fed to the tensor cores, and an SM issues
at most one warp-instruction per scheduler per clock (four per SM). ``hot_loop`` finds the kernel's
innermost loop that does the GEMM work (the one with the most HMMA/HGMMA instructions, or for a
GEMV the most FFMA/FMUL) and counts its instructions by opcode; ``issue_floor_us`` turns that into
the time the SMs need just to issue the loop for a given number of weights: a compile-only lower
bound on the kernel's time from instruction issue alone (no stalls, no instructions outside the
loop), to set beside the byte roof of traffic.py. Static facts, not measurements.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

H200_SM_CLOCK_GHZ = 1.98  # boost clock (datasheet); a sustained decode clock is lower, so the floor is optimistic
ISSUE_PER_SM_PER_CLK = 4  # one warp-instruction per scheduler per clock, four schedulers per SM

_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_.]+)?)\s*([^;]*);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")
# opcode classes reported per loop (the first token of the opcode, before any '.')
CLASSES = {
    "mma": ("HMMA", "HGMMA", "IMMA", "QMMA", "WARPGROUP"),
    "load_global": ("LDG", "LDGSTS", "UTMALDG"),
    "shared": ("LDS", "LDSM", "STS", "STSM"),
    "int_logic": ("LOP3", "PRMT", "SHF", "SHL", "SHR", "BMSK", "SGXT"),
    "int_arith": ("IMAD", "IADD3", "IMNMX", "LEA", "IABS", "ISETP", "IMUL"),
    "convert": ("I2F", "F2F", "I2FP", "F2I", "F2FP", "I2IP"),
    "half_fp": ("HFMA2", "HADD2", "HMUL2", "HMNMX2"),
    "fp32": ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL"),
    "move": ("MOV", "SEL", "UMOV", "IMAD.MOV", "SHFL"),
    "sync": ("BAR", "SYNCS", "DEPBAR", "WARPSYNC", "ARRIVES"),
}


@dataclass
class Loop:
    start: int  # instruction index of the loop head
    end: int  # instruction index of the backward branch
    ops: Counter = field(default_factory=Counter)

    @property
    def instructions(self) -> int:
        return self.end - self.start + 1

    def classes(self) -> dict[str, int]:
        out = {name: 0 for name in CLASSES}
        other = 0
        for op, n in self.ops.items():
            base = op.split(".")[0]
            for name, prefixes in CLASSES.items():
                if base in prefixes or op in prefixes:
                    out[name] += n
                    break
            else:
                other += n
        out["other"] = other
        return out


def disassemble(cubin: bytes) -> str:
    """SASS text of a cubin (nvdisasm from Triton's NVIDIA backend)."""
    import triton

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        res = subprocess.run([str(nvdisasm), "-c", str(path)], capture_output=True, text=True, timeout=120, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"nvdisasm failed (exit {res.returncode}): {res.stderr[-400:]}")
    return res.stdout


def parse(sass: str) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """([(opcode, operands)] in order, {label: index of the instruction after it})."""
    insns: list[tuple[str, str]] = []
    labels: dict[str, int] = {}
    for line in sass.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(insns)
            continue
        m = _INSN.search(line)
        if m:
            insns.append((m.group(3), m.group(4)))
    return insns, labels


def loops(sass: str) -> list[Loop]:
    """Every loop: a branch back to a label at or before it."""
    insns, labels = parse(sass)
    out = []
    for i, (op, args) in enumerate(insns):
        if not op.startswith("BRA"):
            continue
        m = _TARGET.search(args)
        if not m or m.group(1) not in labels:
            continue
        head = labels[m.group(1)]
        if head <= i and i - head > 1:  # a branch to itself is the trailing trap loop, not work
            out.append(Loop(head, i, Counter(o for o, _ in insns[head:i + 1])))
    return out


def innermost(all_loops: list[Loop]) -> list[Loop]:
    """The loops that contain no other loop."""
    return [x for x in all_loops if not any(y is not x and x.start <= y.start and y.end <= x.end for y in all_loops)]


def hot_loop(sass: str) -> Loop | None:
    """The innermost loop with the most tensor-core instructions (else the most fp32/half FMA/MUL):
    the K loop of a GEMM, the reduction loop of a GEMV."""
    cands = innermost(loops(sass))
    if not cands:
        return None
    return max(cands, key=lambda lp: (lp.classes()["mma"], lp.classes()["fp32"] + lp.classes()["half_fp"], -lp.instructions))


def loop_facts(cubin: bytes) -> dict:
    """JSON-ready facts of the hot loop (instruction count, counts by opcode class) and the sizes of
    every innermost loop that runs tensor-core instructions (a fused kernel has two)."""
    sass = disassemble(cubin)
    lp = hot_loop(sass)
    if lp is None:
        return {"hot_loop": None, "mma_loops": []}
    inner = [x for x in innermost(loops(sass)) if x.classes()["mma"]]
    return {"hot_loop": {"instructions": lp.instructions, "classes": lp.classes(), "top_ops": dict(lp.ops.most_common(12))},
            "mma_loops": [{"instructions": x.instructions, "mma": x.classes()["mma"]} for x in sorted(inner, key=lambda x: x.start)]}


def compile_facts_with_loop(fn, *, weights_per_iteration: int | None = None, arch: str = "sm_90a", **kw) -> dict:
    """``_triton.compile.compile_facts`` plus :func:`loop_facts` and, given the weights one hot-loop
    iteration streams, the warp-instructions issued per weight."""
    from skillrun_kernels._triton.compile import compile_kernel, kernel_facts

    t0 = time.perf_counter()
    ck = compile_kernel(fn, arch=arch, **kw)
    facts = kernel_facts(ck, fn.__name__, arch, time.perf_counter() - t0)
    facts.update(loop_facts(ck.asm["cubin"]))
    if weights_per_iteration and facts["hot_loop"]:
        facts["hot_loop"]["weights_per_iteration"] = weights_per_iteration
        facts["hot_loop"]["warp_insts_per_weight"] = round(warp_instructions_per_weight(
            facts["hot_loop"]["instructions"], kw["num_warps"], weights_per_iteration), 4)
    return facts


def warp_instructions_per_weight(loop_instructions: int, num_warps: int, weights_per_iteration: int) -> float:
    """Warp-instructions the CTA issues per weight it streams (every warp runs the loop body)."""
    return loop_instructions * num_warps / weights_per_iteration


def issue_floor_us(weights: float, loop_instructions: int, num_warps: int, weights_per_iteration: int,
                   sms: int = 132, clock_ghz: float = H200_SM_CLOCK_GHZ) -> float:
    """Microseconds the SMs need to issue the hot loop over ``weights`` weights (no stalls)."""
    wi = warp_instructions_per_weight(loop_instructions, num_warps, weights_per_iteration)
    return weights * wi / (ISSUE_PER_SM_PER_CLK * sms * clock_ghz * 1e3)
