"""Run ``tl.inline_asm_elementwise`` blocks in Triton's CPU interpreter by executing their PTX text.

Triton 3.6's interpreter refuses inline assembly. The a16wi4 decode kernels' ``int4_cvt: lop3``
path converts int4 words with a short PTX block; this module interprets the few PTX instructions
such blocks use (``mov.b32`` of an immediate or into a ``{lo, hi}`` pair, ``xor.b32``, ``shr.u32``,
``lop3.b32`` with its truth table, ``fma.rn.bf16x2``) on numpy arrays, element by element as the GPU
runs the block per element (``pack=1``), so the kernel around it (loads, joins, dots) runs in the
interpreter as written. What it cannot check is PTX syntax and register constraints: ptxas does
that when the kernel compiles for sm_90a (compile_only). An instruction outside the subset raises.

Import after ``interp_fixups`` (TRITON_INTERPRET=1), before launching a kernel.
"""
from __future__ import annotations

import re

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter as _interp

_REG = re.compile(r"^[%$]?\w+$")


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16).astype(np.uint32)


def _lop3(a: np.ndarray, b: np.ndarray, c: np.ndarray, lut: int) -> np.ndarray:
    out = np.zeros_like(a)
    for idx in range(8):  # bit of the result = lut[(a << 2) | (b << 1) | c], per bit position
        if (lut >> idx) & 1:
            ma = a if idx & 4 else ~a
            mb = b if idx & 2 else ~b
            mc = c if idx & 1 else ~c
            out |= ma & mb & mc
    return out & np.uint32(0xFFFFFFFF)


def run_ptx(asm: str, inputs: list[np.ndarray], n_out: int) -> list[np.ndarray]:
    """Execute the block on uint32 inputs ($n_out.. are the inputs); returns n_out uint16 outputs."""
    regs: dict[str, np.ndarray] = {}
    shape = inputs[0].shape
    for i, v in enumerate(inputs):
        regs[f"${n_out + i}"] = v.astype(np.int64).astype(np.uint32)
    outs: dict[int, np.ndarray] = {}

    def val(tok: str) -> np.ndarray:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        if re.fullmatch(r"0[xX][0-9a-fA-F]+|\d+", tok):
            return np.full(shape, int(tok, 0) & 0xFFFFFFFF, dtype=np.uint32)
        raise ValueError(f"unknown operand {tok!r}")

    for raw in asm.replace("{\n", "\n").split(";"):
        line = raw.strip().strip("{}").strip()
        if not line or line.startswith(".reg"):
            continue
        op, _, rest = line.partition(" ")
        args = [a.strip() for a in re.split(r",(?![^{]*})", rest)]
        if op == "mov.b32" and args[0].startswith("{"):
            lo, hi = (t.strip() for t in args[0].strip("{}").split(","))
            src = val(args[1])
            for tok, part in ((lo, src & 0xFFFF), (hi, src >> 16)):
                outs[int(tok.lstrip("$"))] = part.astype(np.uint16)
        elif op == "mov.b32":
            regs[args[0]] = val(args[1])
        elif op == "xor.b32":
            regs[args[0]] = val(args[1]) ^ val(args[2])
        elif op == "shr.u32":
            regs[args[0]] = val(args[1]) >> val(args[2])
        elif op == "lop3.b32":
            regs[args[0]] = _lop3(val(args[1]), val(args[2]), val(args[3]), int(args[4], 0))
        elif op == "fma.rn.bf16x2":
            a, b, c = val(args[1]), val(args[2]), val(args[3])
            halves = []
            for sh in (0, 16):
                f = [_bf16_to_f32(((x >> sh) & 0xFFFF).astype(np.uint16)) for x in (a, b, c)]
                halves.append(_f32_to_bf16(f[0].astype(np.float64) * f[1] + f[2]))  # one rounding, as fma
            regs[args[0]] = (halves[0] | (halves[1] << 16)).astype(np.uint32)
        else:
            raise NotImplementedError(f"PTX instruction {op!r} is not modelled")
    missing = [i for i in range(n_out) if i not in outs]
    if missing:
        raise ValueError(f"outputs {missing} never written")
    return [outs[i] for i in range(n_out)]


class _Call:
    def __init__(self, results):
        self._results = results

    def get_result(self, i):
        return self._results[i]


def _create_inline_asm(self, inline_asm, constraints, values, types, is_pure, pack):
    if pack != 1:
        raise NotImplementedError("the PTX model runs pack=1 blocks only")
    n_out = constraints.count("=")
    outs = run_ptx(inline_asm, [v.data for v in values], n_out)
    res = []
    for o, ty in zip(outs, types):
        scalar = getattr(ty, "element_ty", ty)
        if scalar != tl.bfloat16:
            raise NotImplementedError(f"the PTX model returns bf16 outputs, not {scalar}")
        res.append(_interp.TensorHandle(o.astype(np.uint16), tl.bfloat16))
    return _Call(res)


_interp.InterpreterBuilder.create_inline_asm = _create_inline_asm
