"""A port that is wrong on purpose (the e2e output check must catch it) and one that raises."""
import torch

from skillrun_kernels.protocol import KernelLaunch


def build_wrong(shape, config, device):
    def run(p, out):
        out.copy_(torch.zeros_like(out))
        out[..., 0] = 1.0  # far outside any tolerance
        return out

    return KernelLaunch(name="wrong", run=run)


def build_raises(shape, config, device):
    def run(p, out):
        raise RuntimeError("boom: this port always fails")

    return KernelLaunch(name="raises", run=run)
