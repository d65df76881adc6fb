"""FP8 block-scaled GEMM workload for `skill-run profile` (the fp8 blockscale card's seed shapes).

    skill-run profile --out fp8_blockscale_h200.json.gz -- python benchmarks/workloads/fp8_blockscale_workload.py

Runs `torch._scaled_mm` with DeepSeek-style block scales (activations 1x128, weights 128x128,
fp32 decode scales, bf16 output), which PyTorch sends to cuBLASLt on sm_90. Each iteration runs
every shape once and then calls `skillrun.profiling.step()`. Step 0 is the set-up (quantisation,
first calls), iteration i is step i+1: `--steps 1:` keeps every timed iteration and nothing else. Layouts (/work/shared/design/h200-measured.md, hopper-fp8-facts.md §1):
scale_a (M, K/128) with strides (1, M); scale_b the (N/128, K/128) row-major weight scales
transposed, i.e. shape (K/128, N/128) with strides (1, K/128); b is the (N, K) weight transposed.

Known vendor limits, reported and not hidden: M=1 is rejected by cuBLAS (the shape is skipped with
a note) and K=768 (K/128 = 6, not a multiple of 4) runs but gives wrong values in cuBLASLt
builds without PyTorch PR #166752; the timing of that shape is still what a user would see.
Needs CUDA sm_90; elsewhere it prints why and exits 0 without doing anything.
"""
from __future__ import annotations

import argparse
import sys

try:
    from skillrun.profiling import step
except ImportError:  # running outside a skillrun checkout/install: markers are optional
    def step() -> None:
        pass
try:
    from skillrun.profiling import save_output  # `skill-run e2e` compares these between arms
except ImportError:
    def save_output(name, tensor) -> None:
        pass

# (M, N, K): the card's seed shapes; M=1 and M=64 are the decode cases.
SHAPES = [(4096, 65536, 1536), (4096, 2048, 7168), (16384, 1536, 7168), (16384, 7168, 768), (1, 7168, 2048), (64, 7168, 2048)]
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(";"):
        m, n, k = (int(v) for v in item.replace("x", ",").split(","))
        if k % 128 or n % 128:
            raise SystemExit(f"shape {item}: N and K must be multiples of 128 for 128x128 weight blocks")
        shapes.append((m, n, k))
    return shapes


def quant_act_1x128(x, torch):
    """(M, K) -> fp8 values and (M, K/128) fp32 decode scales laid out with strides (1, M)."""
    m, k = x.shape
    groups = x.float().view(m, k // 128, 128)
    scale = groups.abs().amax(dim=-1).clamp_min(1e-12) / FP8_MAX
    q = (groups / scale.unsqueeze(-1)).to(torch.float8_e4m3fn).view(m, k)
    return q, scale.t().contiguous().t()


def quant_weight_128x128(w, torch):
    """(N, K) -> fp8 values and (N/128, K/128) fp32 decode scales, one per 128x128 block."""
    n, k = w.shape
    blocks = w.float().view(n // 128, 128, k // 128, 128)
    scale = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(n, k)
    return q, scale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=6, help="iterations; each runs every shape once and ends a profiler step")
    ap.add_argument("--shapes", type=parse_shapes, default=SHAPES, help="M,N,K;M,N,K… (default: the seed shapes)")
    ap.add_argument("--check", action="store_true", help="compare each shape once against an fp32 dequant oracle "
                    "(adds fp32 GEMM kernels to the profile)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("fp8_blockscale_workload: no CUDA device; block-scaled torch._scaled_mm needs sm_90. Nothing to do.")
        return 0
    cap = torch.cuda.get_device_capability()
    if cap[0] != 9 or not hasattr(torch, "float8_e4m3fn"):
        print(f"fp8_blockscale_workload: device is sm_{cap[0]}{cap[1]}; PyTorch's 1x128/128x128 scaled_mm runs on sm_90 only. Nothing to do.")
        return 0
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} cuda {torch.version.cuda}")

    cases = []
    for m, n, k in args.shapes:
        x = torch.randn(m, k, device=dev)
        w = torch.randn(n, k, device=dev) * 0.05
        qa, sa = quant_act_1x128(x, torch)
        qw, sw = quant_weight_128x128(w, torch)
        case = {"shape": (m, n, k), "a": qa, "b": qw.t(), "sa": sa, "sb": sw.t(), "ms": []}
        try:
            got = torch._scaled_mm(qa, qw.t(), scale_a=sa, scale_b=sw.t(), out_dtype=torch.bfloat16)
            torch.cuda.synchronize()
        except RuntimeError as exc:
            print(f"skip M={m} N={n} K={k}: torch._scaled_mm refused it ({str(exc).splitlines()[0][:160]})")
            continue
        if (k // 128) % 4:
            print(f"note M={m} N={n} K={k}: K/128={k // 128} is not a multiple of 4; cuBLASLt without PyTorch PR #166752 "
                  f"returns wrong values here (timing still representative)")
        if args.check:
            ref = (qa.float().view(m, k // 128, 128) * sa.unsqueeze(-1)).view(m, k) @ \
                  (qw.float().view(n // 128, 128, k // 128, 128) * sw[:, None, :, None]).view(n, k).t()
            rel = ((got.float() - ref).norm() / ref.norm()).item()
            print(f"check M={m} N={n} K={k}: relative error vs fp32 dequant oracle {rel:.4f}")
        del got, x, w
        cases.append(case)
    if not cases:
        print("no shape ran")
        return 0
    torch.cuda.synchronize()
    step()  # step 0 is set-up (quantisation, first calls); iteration i is step i + 1

    for it in range(args.iters):
        for c in cases:
            m, n, k = c["shape"]
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.profiler.record_function(f"fp8_blockscale M={m} N={n} K={k}"):
                start.record()
                c["y"] = torch._scaled_mm(c["a"], c["b"], scale_a=c["sa"], scale_b=c["sb"], out_dtype=torch.bfloat16)
                end.record()
            c["ms"].append((start, end))
        torch.cuda.synchronize()  # keep each iteration's kernels inside its own profiler step
        step()

    for c in cases:
        if "y" in c:
            save_output("M{}xN{}xK{}".format(*c["shape"]), c["y"])
    print(f"{'M':>6} {'N':>6} {'K':>6} {'median ms':>10} {'TFLOP/s':>8}  ({args.iters} iterations, first excluded, includes profiler overhead)")
    for c in cases:
        m, n, k = c["shape"]
        times = sorted(s.elapsed_time(e) for s, e in c["ms"][1:] or c["ms"])
        med = times[len(times) // 2]
        print(f"{m:>6} {n:>6} {k:>6} {med:>10.4f} {2 * m * n * k / med / 1e9:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
