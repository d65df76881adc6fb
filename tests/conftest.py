import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def traces_dir() -> Path | None:
    """The public fixture traces (../shared/traces beside the checkout, or $SKILLRUN_TRACES)."""
    env = os.environ.get("SKILLRUN_TRACES")
    p = Path(env) if env else REPO.parent / "shared" / "traces"
    return p if p.is_dir() else None


@pytest.fixture
def shared_traces() -> Path:
    p = traces_dir()
    if p is None:
        pytest.skip("../shared/traces is not present (set SKILLRUN_TRACES)")
    return p


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # torch absent or broken: no GPU either way
        has_gpu = False
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm device (none here)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip)
