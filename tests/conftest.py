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


# `make test` runs on pytest-xdist workers, which start with COLUMNS=80 in their environment whatever the
# controller had; the CLI then wraps paths at 80 columns where a plain run (stdout not a terminal, no
# COLUMNS) prints them whole. Each worker gets the controller's own value back.
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["skillrun_columns"] = os.environ.get("COLUMNS")


def pytest_configure(config):
    wi = getattr(config, "workerinput", None)
    if wi is not None and "skillrun_columns" in wi:
        if wi["skillrun_columns"] is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = wi["skillrun_columns"]


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


@pytest.fixture(autouse=True)
def _no_device_wheels(monkeypatch, tmp_path_factory):
    """The device scripts these tests run source .ci/device-env.sh, which installs .whl/*.whl (cp312 wheels for
    the H200 image) when the folder exists: a developer who fetched them must not get them installed into the
    test's Python. An empty folder of wheels instead."""
    monkeypatch.setenv("SKILLRUN_WHEELS", str(tmp_path_factory.mktemp("no-wheels")))
