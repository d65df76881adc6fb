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


@pytest.fixture(autouse=True, scope="module")
def _kb_root_is_reset_after_each_module():
    """`--kb` (and api.load_index(kb)) pins the knowledge base for the whole process, as a CLI run
    needs; a test module that points it at a fixture must not leave later modules reading that one."""
    yield
    from skillrun.kb.paths import set_kb_root

    set_kb_root(None)
