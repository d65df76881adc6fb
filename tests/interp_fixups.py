"""Fixes for two bf16 gaps in Triton 3.6's CPU interpreter, applied only inside interpreter runs.

The interpreter stores bf16 as raw uint16 bits, has no bf16 scalar constants, and (1) ``tl.dot`` and elementwise arithmetic on
bf16 operands work on those bit patterns as integers, (2) casts to bf16 truncate (fp32) or
reinterpret (ints) instead of rounding to nearest even as the GPU does. Each would make a correct
kernel look wrong on the CPU. We convert bf16 dot operands to fp32 (bf16 products are exact in
fp32, as on the tensor cores), do bf16 arithmetic in fp32 rounded once to bf16 (what the GPU's
bf16 instructions return), and round casts with torch. Casts from fp32 to fp8 e4m3fn also round
wrongly (no carry into the exponent when rounding up, fix (4) below): torch rounds those too.
Kernel code stays exactly as it runs on the GPU.
Import after setting TRITON_INTERPRET=1 and before launching any kernel.
"""
from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter as _interp

_orig_dot = _interp.InterpreterBuilder.create_dot
_orig_cast = _interp.InterpreterBuilder.cast_impl
_orig_fp_to_fp = _interp.InterpreterBuilder.create_fp_to_fp


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16)


def _dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    def up(h):
        if h.dtype.scalar == tl.bfloat16:
            return _interp.TensorHandle(_bf16_bits_to_f32(h.data), tl.float32)
        return h

    return _orig_dot(self, up(a), up(b), d, input_precision, max_num_imprecise_acc)


def _cast(self, src, dst_type):
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        return _interp.TensorHandle(_f32_to_bf16_bits(src.data), tl.bfloat16)
    if src.dtype.scalar.is_int() and dst_type.scalar == tl.bfloat16:
        return _interp.TensorHandle(_f32_to_bf16_bits(src.data.astype(np.float32)), tl.bfloat16)
    return _orig_cast(self, src, dst_type)


def _fp_to_fp(self, src, dst_type, rounding_mode):
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        return _interp.TensorHandle(_f32_to_bf16_bits(src.data), tl.bfloat16)
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
        # (4) fp32 -> e4m3fn: the interpreter's rounding adds the cut-off bit to the 3-bit mantissa
        # without carrying into the exponent (31.84 -> 16 instead of 32); torch rounds as the GPU does.
        t = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.float8_e4m3fn)
        return _interp.TensorHandle(t.view(torch.uint8).numpy(), tl.float8e4nv)
    return _orig_fp_to_fp(self, src, dst_type, rounding_mode)


_orig_binary = _interp.InterpreterBuilder.binary_op


def _binary(self, lhs, rhs, op):
    if lhs.dtype.scalar == tl.bfloat16 and rhs.dtype.scalar == tl.bfloat16:
        res = op(_bf16_bits_to_f32(lhs.data), _bf16_bits_to_f32(rhs.data))
        if res.dtype == np.float32:
            return _interp.TensorHandle(_f32_to_bf16_bits(res), tl.bfloat16)
        return _interp.TensorHandle(res, tl.int1) if res.dtype == bool else _orig_binary(self, lhs, rhs, op)
    return _orig_binary(self, lhs, rhs, op)


_interp.InterpreterBuilder.binary_op = _binary
for _name in ("create_fadd", "create_fmul", "create_fsub", "create_fdiv"):
    _np_op = {"create_fadd": np.add, "create_fmul": np.multiply, "create_fsub": np.subtract, "create_fdiv": np.divide}[_name]
    setattr(_interp.InterpreterBuilder, _name, lambda self, lhs, rhs, _op=_np_op: _binary(self, lhs, rhs, _op))
_interp.InterpreterBuilder.create_dot = _dot
_interp.InterpreterBuilder.cast_impl = _cast
_interp.InterpreterBuilder.create_si_to_fp = lambda self, src, dst_type: _cast(self, src, dst_type)
_interp.InterpreterBuilder.create_fp_trunc = lambda self, src, dst_type: _cast(self, src, dst_type)
_interp.InterpreterBuilder.create_fp_to_fp = _fp_to_fp
# (3) bf16 scalar constants (e.g. ``bf16_tensor - 136.0``): the interpreter has no get_bf16 at all.
_interp.InterpreterBuilder.get_bf16 = lambda self, value: _interp.TensorHandle(
    _f32_to_bf16_bits(np.array([value], dtype=np.float32)), tl.bfloat16)
