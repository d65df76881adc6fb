"""The device side of MoE routing in Triton kernels: which sorted (token, slot) pairs a program's
expert block holds (the layout of ``moe_a16wi4.triton_sm90.align_by_expert``)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def block_pairs(pid_m, sorted_ptr, block_expert_ptr, valid_end_ptr, BLOCK_M: tl.constexpr):
    """(expert, row mask, pair ids) of expert block ``pid_m``: rows past the expert's valid end are
    masked off (their pair id reads as 0, never used unmasked)."""
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rvalid = rows < tl.load(valid_end_ptr + e)
    pair = tl.load(sorted_ptr + rows, mask=rvalid, other=0).to(tl.int64)
    return e, rvalid, pair
