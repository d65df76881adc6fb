"""Tiny per-batch row-wise fp8 loop for `skill-run e2e` tests on the CPU (Triton interpreter).

    python rowwise_loop.py [--iters N] [--mode ok|wrong|fail|none|compile]

Each iteration runs one torch._scaled_mm per batch (M=16, N=32, K=64, row-wise scales, bf16 out),
saves the stacked output once, and marks a step. Modes make the bad cases:
  wrong   - tests/e2e_workloads/wrong_port.py is the routed kernel (the test's plan says so)
  fail    - exit 3 after the loop (both arms fail)
  none    - call the op at a shape no plan selects (zero routed calls)
  compile - run the loop body through torch.compile
"""
import argparse
import os
import sys

import torch

from skillrun import profiling

B, M, N, K = 2, 16, 32, 64


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--mode", default="ok")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    m = M + 16 if args.mode == "none" else M
    x = torch.randn(B, m, K, generator=g)
    w = torch.randn(B, N, K, generator=g) / K ** 0.5
    xs = x.abs().amax(-1) / 448.0
    ws = w.abs().amax(-1) / 448.0
    xq = (x / xs[..., None]).to(torch.float8_e4m3fn)
    wq = (w / ws[..., None]).to(torch.float8_e4m3fn)

    def layer():
        return torch.stack([torch._scaled_mm(xq[b], wq[b].t(), scale_a=xs[b].reshape(-1, 1).contiguous(),
                                             scale_b=ws[b].reshape(1, -1).contiguous(), out_dtype=torch.bfloat16)
                            for b in range(B)])

    fn = torch.compile(layer) if args.mode == "compile" else layer
    profiling.step()
    for _ in range(args.iters):
        y = fn()
        profiling.step()
    profiling.save_output("y", y)
    if os.environ.get("SKILLRUN_OUTPUT_DIR"):  # for a user --check command
        torch.save(y, os.path.join(os.environ["SKILLRUN_OUTPUT_DIR"], "y.pt"))
    return 3 if args.mode == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
