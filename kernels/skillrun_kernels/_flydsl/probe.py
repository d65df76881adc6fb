"""The smallest real FlyDSL kernel: each thread writes its id into a buffer.

``skill-run doctor`` compiles it (compile-only, in a child process, through the same path as
``skill-run check``) to say whether FlyDSL can build code objects for gfx950/gfx942 on this machine,
with the linker it found, in seconds instead of a full GEMM compile.
"""
from __future__ import annotations

NTHREADS = 64
KERNEL_NAME = "skillrun_probe_store_tid"


def make_launcher():
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    from . import dsl as D

    @flyc.kernel(name=KERNEL_NAME)
    def kernel(OUT: fx.Tensor):
        tid = D.thread_id()
        rs = D.tensor_rsrc(OUT, NTHREADS * 4)
        D.buffer_store(D.raw(tid), rs, tid * 4)

    @flyc.jit
    def launch(OUT: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
        kernel(OUT).launch(grid=(1, 1, 1), block=(NTHREADS, 1, 1), stream=stream)

    return launch


def compile_only(shape: dict, config: dict, arch: str) -> dict:
    from .runtime import compile_stream_launcher

    def placeholders() -> tuple:
        import torch

        return (torch.empty(NTHREADS, dtype=torch.int32, device="meta"),)

    return compile_stream_launcher(make_launcher, placeholders, arch=arch, tag=KERNEL_NAME,
                                   describe={"probe": True})
