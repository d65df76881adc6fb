"""A user `--check` command: exit 0 when both arms' y.pt agree within 1e-2, 1 otherwise."""
import os
import sys

import torch

a = torch.load(os.path.join(os.environ["SKILLRUN_E2E_A_DIR"], "y.pt")).float()
b = torch.load(os.path.join(os.environ["SKILLRUN_E2E_B_DIR"], "y.pt")).float()
ok = torch.allclose(a, b, rtol=1e-2, atol=1e-2)
print("close" if ok else f"differ: max abs {float((a - b).abs().max()):.3g}")
sys.exit(0 if ok else 1)
