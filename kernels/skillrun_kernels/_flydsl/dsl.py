"""Small kernel-side building blocks on top of FlyDSL (0.4.2 to 0.5.x; version-sensitive imports in compat.py), used while a kernel is being traced.

The ports address memory with explicit byte offsets computed by each family's ``layout.py`` (the
same functions the host tests simulate), so they need only a handful of primitives:

* buffer resources (``V#``) built from a tensor's base address with an exact byte bound, so a
  load past the end of a per-batch / per-matrix region returns 0 and a store there is dropped;
* 4..16-byte buffer loads/stores (``buffer_load_dwordx4`` etc.), scalar (SMEM) loads of
  wave-uniform values, LDS loads/stores at byte offsets (``ds_read_b128``/``ds_write_b128``);
* the MFMA instructions the ports use, with the E8M0 scale operand explicit;
* a runtime ``scf.for`` with loop-carried values (for the rolled K loops).

Everything returns raw MLIR ``ir.Value``s; integer index math is done with ``fx.Int32`` values so
that the layout functions (plain ``+ * // % >> &`` code) run unchanged on them. Import this module
only inside a FlyDSL kernel trace (it imports flydsl at import time).
"""
from __future__ import annotations

from typing import Callable, Sequence

import flydsl.expr as fx
import numpy as np
from flydsl.expr import rocdl as _xrocdl

from .compat import mlir as _mlir

# FlyDSL's MLIR bindings move between releases: compat.mlir() is the one place that knows where.
ir, _dialects = _mlir()
_arith, _llvm, _rocdl, _scf, _vector = (_dialects.arith, _dialects.llvm, _dialects.rocdl, _dialects.scf,
                                        _dialects.vector)

# Buffer-descriptor word 3 on CDNA (gfx9): DATA_FORMAT=7 (32-bit), NUM_FORMAT=4; no RDNA bits.
_CDNA_RSRC_FLAGS = (7 << 12) | (4 << 15)
# E8M0 exponent 127 is 2^0 = 1.0; four packed copies, one per byte the op_sel can pick.
E8M0_ONE_X4 = 0x7F7F7F7F
_GEP_DYNAMIC = -(2**31)


# ---------------------------------------------------------------- types and constants
def i32_t() -> ir.Type:
    return ir.IntegerType.get_signless(32)


def i64_t() -> ir.Type:
    return ir.IntegerType.get_signless(64)


def f32_t() -> ir.Type:
    return ir.F32Type.get()


def bf16_t() -> ir.Type:
    return ir.BF16Type.get()


def vec_t(n: int, elem: ir.Type) -> ir.Type:
    return ir.VectorType.get([n], elem)


def raw(v) -> ir.Value:
    """An ``ir.Value`` from an fx numeric, a Python int (as i32) or float (as f32), or a value."""
    if isinstance(v, bool):
        raise TypeError("raw() does not take bools")
    if isinstance(v, int):
        return _arith.constant(i32_t(), v if v < 2**31 else v - 2**32)
    if isinstance(v, float):
        return _arith.constant(f32_t(), v)
    if not isinstance(v, ir.Value) and hasattr(v, "ir_value"):
        return v.ir_value()
    return v


def I32(v) -> "fx.Int32":
    """Wrap as ``fx.Int32`` so Python operators (and the layout functions) work on it."""
    if isinstance(v, fx.Int32):
        return v
    return fx.Int32(raw(v) if not isinstance(v, int) else v)


def i64(v) -> ir.Value:
    """Sign-extend an i32 value (or a Python int) to i64."""
    if isinstance(v, int):
        return _arith.constant(i64_t(), v)
    r = raw(v)
    if r.type == i64_t():
        return r
    return _arith.extsi(i64_t(), r)


def mul64(a, b) -> ir.Value:
    """``a * b`` in 64-bit (batch and expert windows can exceed 2 GiB in total)."""
    return _arith.muli(i64(a), i64(b))


def f32_const(x: float) -> ir.Value:
    return _arith.constant(f32_t(), float(x))


def zeros_f32(n: int) -> ir.Value:
    return _vector.broadcast(vec_t(n, f32_t()), f32_const(0.0))


def splat(value: ir.Value, n: int) -> ir.Value:
    return _vector.broadcast(vec_t(n, value.type), value)


# ---------------------------------------------------------------- thread / block ids
def thread_id() -> "fx.Int32":
    return I32(fx.gpu.thread_id("x"))


def block_id(dim: str) -> "fx.Int32":
    return I32(fx.gpu.block_id(dim))


def wave_uniform(v) -> "fx.Int32":
    """``v_readfirstlane``: tell the compiler a per-lane value is the same across the wave (SGPR)."""
    return I32(_rocdl.readfirstlane(i32_t(), raw(v)))


# ---------------------------------------------------------------- global memory
def global_base(tensor) -> ir.Value:
    """The ``!llvm.ptr<1>`` base address of a kernel tensor argument."""
    return fx.get_iter(tensor).llvm_ptr


def ptr_add(ptr: ir.Value, byte_offset) -> ir.Value:
    """Byte-offset a global pointer (64-bit address arithmetic; ``byte_offset`` is sign-extended)."""
    return _llvm.getelementptr(ptr.type, ptr, [i64(byte_offset)], [_GEP_DYNAMIC], ir.IntegerType.get_signless(8), 0)


def make_rsrc(base_ptr: ir.Value, num_bytes) -> ir.Value:
    """A raw buffer descriptor over ``[base, base + num_bytes)``; accesses outside read 0 / are dropped."""
    rsrc_t = ir.Type.parse("!llvm.ptr<8>")
    stride = _arith.constant(ir.IntegerType.get_signless(16), 0)
    return _rocdl.make_buffer_rsrc(rsrc_t, base_ptr, stride, i64(num_bytes), raw(_CDNA_RSRC_FLAGS))


def tensor_rsrc(tensor, num_bytes=None, byte_offset=None) -> ir.Value:
    base = global_base(tensor)
    if byte_offset is not None:
        base = ptr_add(base, byte_offset)
    return make_rsrc(base, num_bytes if num_bytes is not None else 0xFFFFFFFF)


def _load_type(nbytes: int) -> ir.Type:
    if nbytes == 16:
        return vec_t(4, i32_t())
    if nbytes == 8:
        return vec_t(2, i32_t())
    if nbytes == 4:
        return i32_t()
    if nbytes == 2:
        return ir.IntegerType.get_signless(16)
    raise ValueError(f"unsupported buffer access width {nbytes} bytes (16, 8, 4 or 2)")


def buffer_load(rsrc: ir.Value, byte_offset, nbytes: int = 16, *, nontemporal: bool = False) -> ir.Value:
    """``buffer_load_dword{,x2,x4}`` / ``_ushort`` at a per-lane byte offset; i32 lanes (i16 for 2 B)."""
    aux = ir.IntegerAttr.get(i32_t(), 2 if nontemporal else 0)
    return _rocdl.raw_ptr_buffer_load(_load_type(nbytes), rsrc, raw(byte_offset), raw(0), aux=aux)


def buffer_store(value: ir.Value, rsrc: ir.Value, byte_offset) -> None:
    _rocdl.raw_ptr_buffer_store(value, rsrc, raw(byte_offset), raw(0), aux=ir.IntegerAttr.get(i32_t(), 0))


def buffer_atomic_fadd(value: ir.Value, rsrc: ir.Value, byte_offset) -> None:
    """Atomic add without return (``buffer_atomic_add_f32`` for f32, ``_pk_add_bf16`` for 2 x bf16)."""
    _rocdl.raw_ptr_buffer_atomic_fadd(value.type, value, rsrc, raw(byte_offset), raw(0), aux=ir.IntegerAttr.get(i32_t(), 0))


def scalar_load_i32(rsrc: ir.Value, byte_offset) -> ir.Value:
    """SMEM load of one wave-uniform dword (``s_buffer_load_dword``); the offset must be uniform."""
    i128 = ir.IntegerType.get_signless(128)
    v4 = _llvm.bitcast(vec_t(4, i32_t()), _llvm.ptrtoint(i128, rsrc))
    return _llvm.call_intrinsic(i32_t(), "llvm.amdgcn.s.buffer.load.i32", [v4, raw(byte_offset), raw(0)], [], [])


def scalar_load_f32(rsrc: ir.Value, byte_offset) -> ir.Value:
    return _arith.bitcast(f32_t(), scalar_load_i32(rsrc, byte_offset))


# ---------------------------------------------------------------- LDS
def lds_alloc(nbytes: int) -> ir.Value:
    """Static LDS of ``nbytes`` (16-byte aligned); returns its ``!llvm.ptr<3>`` base."""
    storage = fx.SharedAllocator(16).allocate(nbytes)
    return storage.peek().ptr.llvm_ptr


def _lds_ptr(base: ir.Value, byte_offset) -> ir.Value:
    return _llvm.getelementptr(base.type, base, [raw(byte_offset)], [_GEP_DYNAMIC], ir.IntegerType.get_signless(8), 0)


def lds_load(base: ir.Value, byte_offset, vtype: ir.Type, align: int = 16) -> ir.Value:
    """LDS load at a byte offset; ``align`` is the alignment the offset is guaranteed to have."""
    return _llvm.load(vtype, _lds_ptr(base, byte_offset), alignment=align)


def lds_store(base: ir.Value, byte_offset, value: ir.Value, align: int = 16) -> None:
    _llvm.store(value, _lds_ptr(base, byte_offset), alignment=align)


def barrier() -> None:
    """Workgroup barrier (``s_barrier`` plus the LDS waits the compiler inserts)."""
    fx.gpu.barrier()


def s_barrier() -> None:
    """A bare ``s_barrier`` (no implied memory fence): the ping-pong phase barrier."""
    _rocdl.s_barrier()


def setprio(level: int) -> None:
    _rocdl.s_setprio(level)


def sched_barrier() -> None:
    _xrocdl.sched_barrier(0)


# ---------------------------------------------------------------- vectors
def concat(a: ir.Value, b: ir.Value) -> ir.Value:
    n = ir.VectorType(a.type).shape[0] + ir.VectorType(b.type).shape[0]
    return _vector.shuffle(a, b, list(range(n)))


def slice_vec(v: ir.Value, start: int, length: int) -> ir.Value:
    return _vector.shuffle(v, v, list(range(start, start + length)))


def extract(v: ir.Value, i: int) -> ir.Value:
    return _vector.extract(v, static_position=[i], dynamic_position=[])


def from_elements(vals: Sequence[ir.Value]) -> ir.Value:
    return _vector.from_elements(vec_t(len(vals), vals[0].type), list(vals))


def bitcast(v: ir.Value, to: ir.Type) -> ir.Value:
    return _vector.bitcast(to, v) if isinstance(v.type, ir.VectorType) else _arith.bitcast(to, v)


# ---------------------------------------------------------------- MFMA
def mfma_scale_16x16x128(a: ir.Value, b: ir.Value, acc: ir.Value, scale_a: ir.Value, scale_b: ir.Value) -> ir.Value:
    """``v_mfma_scale_f32_16x16x128_f8f6f4`` (fp8 e4m3 both sides); scales are packed E8M0 i32 VGPRs."""
    return _xrocdl.mfma_scale_f32_16x16x128_f8f6f4(
        vec_t(4, f32_t()), [a, b, acc, 0, 0, 0, scale_a, 0, scale_b]
    )


def e8m0_one() -> ir.Value:
    """The neutral E8M0 scale (127 = 2^0) in all four bytes."""
    return raw(E8M0_ONE_X4)


def mfma_fp8_16x16x32(a_i64: ir.Value, b_i64: ir.Value, acc: ir.Value) -> ir.Value:
    """gfx942 ``v_mfma_f32_16x16x32_fp8_fp8`` (8 fp8 per lane as i64)."""
    return _xrocdl.mfma_f32_16x16x32_fp8_fp8(vec_t(4, f32_t()), [a_i64, b_i64, acc])


def mfma_bf16_16x16x32(a: ir.Value, b: ir.Value, acc: ir.Value) -> ir.Value:
    """gfx950 ``v_mfma_f32_16x16x32_bf16`` (8 bf16 per lane)."""
    return _xrocdl.mfma_f32_16x16x32_bf16(vec_t(4, f32_t()), [a, b, acc])


def mfma_bf16_16x16x16(a: ir.Value, b: ir.Value, acc: ir.Value) -> ir.Value:
    """gfx942 ``v_mfma_f32_16x16x16_bf16`` (4 bf16 per lane; the op takes them as ``vector<4xi16>``)."""
    i16x4 = vec_t(4, ir.IntegerType.get_signless(16))
    return _xrocdl.mfma_f32_16x16x16bf16_1k(vec_t(4, f32_t()), [bitcast(a, i16x4), bitcast(b, i16x4), acc])


# ---------------------------------------------------------------- float helpers
def fma(a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a*b + c, contracted into one ``v_fma``/``v_pk_fma_f32``."""
    _math = _dialects.math

    return _math.fma(a, b, c)


def mulf(a: ir.Value, b: ir.Value) -> ir.Value:
    return _arith.mulf(a, b)


def addf(a: ir.Value, b: ir.Value) -> ir.Value:
    return _arith.addf(a, b)


def to_bf16(v: ir.Value) -> ir.Value:
    """f32 (vector) -> bf16 (vector), round to nearest even (``v_cvt_pk_bf16_f32`` on gfx950)."""
    t = v.type
    if isinstance(t, ir.VectorType):
        return _arith.truncf(vec_t(ir.VectorType(t).shape[0], bf16_t()), v)
    return _arith.truncf(bf16_t(), v)


def int4_codes_to_f32(word: ir.Value) -> ir.Value:
    """The 8 signed int4 codes of a dword (code i in bits [4i, 4i+4)) as ``vector<8xf32>``.

    Shift code i to the top (``shl 28-4i``) and sign-extend it back (``ashr 28``): LLVM folds the
    pair into one signed bit-field extract per code.
    """
    v = splat(word, 8)
    shl = _arith.constant(vec_t(8, i32_t()), ir.DenseElementsAttr.get(
        np.array([28 - 4 * i for i in range(8)], dtype=np.int32), type=vec_t(8, i32_t())))
    sra = splat(raw(28), 8)
    codes = _arith.shrsi(_arith.shli(v, shl), sra)
    return sitofp(codes)


def silu(x: ir.Value) -> ir.Value:
    """x * sigmoid(x) = x / (1 + exp(-x)) in f32."""
    _math = _dialects.math

    one = splat(f32_const(1.0), ir.VectorType(x.type).shape[0]) if isinstance(x.type, ir.VectorType) else f32_const(1.0)
    return _arith.divf(x, _arith.addf(one, _math.exp(_arith.negf(x))))


def sitofp(v: ir.Value) -> ir.Value:
    t = v.type
    if isinstance(t, ir.VectorType):
        return _arith.sitofp(vec_t(ir.VectorType(t).shape[0], f32_t()), v)
    return _arith.sitofp(f32_t(), v)


def select(cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    return _arith.select(cond, a, b)


# ---------------------------------------------------------------- control flow
def rolled_loop(lower, upper, init: Sequence[ir.Value], body: Callable[[ir.Value, list], list]) -> list:
    """A runtime ``scf.for lower..upper`` (i32 bounds) carrying ``init``; ``body(iv, state) -> new state``.

    Written with the raw ``scf`` op rather than the AST ``range(..., init=)`` sugar so it works from
    plain helper functions, which FlyDSL's AST rewriter does not process.
    """
    idx = ir.IndexType.get()
    lb = _arith.index_cast(idx, raw(lower))
    ub = _arith.index_cast(idx, raw(upper))
    step = _arith.constant(idx, 1)
    loop = _scf.ForOp(lb, ub, step, list(init))
    with ir.InsertionPoint(loop.body):
        iv = _arith.index_cast(i32_t(), loop.induction_variable)
        new_state = body(iv, list(loop.inner_iter_args))
        if len(new_state) != len(init):
            raise ValueError(f"rolled_loop body returned {len(new_state)} values for {len(init)} carried")
        _scf.YieldOp(list(new_state))
    return list(loop.results)


def if_then(cond: ir.Value, then: Callable[[], None]) -> None:
    """A runtime ``scf.if`` without results (side effects only: stores, atomics)."""
    op = _scf.IfOp(cond, [], has_else=False)
    with ir.InsertionPoint(op.then_block):
        then()
        _scf.YieldOp([])


def cmp_lt(a, b) -> ir.Value:
    return _arith.cmpi(_arith.CmpIPredicate.slt, raw(a), raw(b))


def cmp_ge(a, b) -> ir.Value:
    return _arith.cmpi(_arith.CmpIPredicate.sge, raw(a), raw(b))


def cmp_eq(a, b) -> ir.Value:
    return _arith.cmpi(_arith.CmpIPredicate.eq, raw(a), raw(b))


def select_i32(cond: ir.Value, a, b) -> "fx.Int32":
    return I32(_arith.select(cond, raw(a), raw(b)))


def and_(a: ir.Value, b: ir.Value) -> ir.Value:
    return _arith.andi(a, b)


def guarded_offset(valid: ir.Value, byte_offset) -> ir.Value:
    """``byte_offset`` where ``valid``, else an offset past any buffer bound (the access is dropped/reads 0)."""
    return _arith.select(valid, raw(byte_offset), raw(0x7FFFFFF0))
