"""The CPU-checkable pieces of issue 40's device work: benchmarks/device_issue40.sh parses, names what
exists and the five shapes of the issue, and packs what it leaves in $OUT into files the device tool
returns (at most 8, plain names); benchmarks/make_deepgemm_src.sh assembles the DeepGEMM source copy
from three git directories at the submodule commits DeepGEMM's own tree records.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_issue40.sh"
MAKE_SRC = ROOT / "benchmarks" / "make_deepgemm_src.sh"
ISSUE_SHAPES = {"4096,65536,1536", "4096,2048,7168", "16384,1536,7168", "16384,7168,768", "8192,8192,8192"}

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("git") is None, reason="no bash or git")


def test_device_script_parses_names_what_exists_and_the_issues_shapes():
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    text = SCRIPT.read_text()
    for path in (".ci/device-env.sh", "benchmarks/device_deepgemm_build.sh", "benchmarks/bench_fp8_blockscale_sm90.py",
                 "benchmarks/validate_recipes.py", "tests/test_fp8_blockscale_gluon_ws.py", "benchmarks/device_budget.sh"):
        assert path in text and (ROOT / path).exists(), path
    large = re.search(r'LARGE=\$\{LARGE:-"([^"]+)"\}', text).group(1).split()
    assert set(large) == ISSUE_SHAPES
    assert "--gluon-module gluon_sm90_ws --gluon-ablations" in text and "BUDGET_S" in text


def test_device_script_env_stage_leaves_returnable_files(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "STAGES": "env", "BUDGET_S": "60", "PATH": os.environ.get("PATH", "")}
    res = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 1 <= len(files) <= 8
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in files)
    with tarfile.open(out / "issue40_evidence.tgz") as tf:
        assert "skills/triton_fp8_blockscale_gemm_sm90/SKILL.md" in tf.getnames()


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def _repo(path: Path, files: dict[str, str]) -> str:
    path.mkdir(parents=True)
    _git(path, "init", "-q")
    for rel, body in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(body)
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "x")
    return _git(path, "rev-parse", "HEAD")


def test_make_deepgemm_src_takes_the_submodule_commits_from_deepgemms_tree(tmp_path):
    cut = _repo(tmp_path / "cutlass", {"include/cute/a.hpp": "a", "media/big.png": "x"})
    fmt = _repo(tmp_path / "fmt", {"include/fmt/core.h": "f", "src/x.cc": "y"})
    dg_dir = tmp_path / "dg"
    _repo(dg_dir, {"csrc/python_api.cpp": "c", "deep_gemm/__init__.py": "v", "scripts/generate_pyi.py": "g",
                   "setup.py": "s", "third-party/tilelang_ops/t.py": "t", "README.md": "r"})
    for name, sha in (("cutlass", cut), ("fmt", fmt)):
        _git(dg_dir, "update-index", "--add", "--cacheinfo", f"160000,{sha},third-party/{name}")
    _git(dg_dir, "commit", "-qm", "submodules")
    dg = _git(dg_dir, "rev-parse", "HEAD")
    out = tmp_path / "deepgemm-src.tar.gz"
    res = subprocess.run(["bash", str(MAKE_SRC), str(dg_dir), str(tmp_path / "cutlass"), str(tmp_path / "fmt"), str(out)],
                         env={**os.environ, "DG_COMMIT": dg}, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    with tarfile.open(out) as tf:
        names = set(tf.getnames())
        commits = tf.extractfile("DeepGEMM/SOURCE_COMMITS").read().decode()
    assert {"DeepGEMM/csrc/python_api.cpp", "DeepGEMM/setup.py", "DeepGEMM/scripts/generate_pyi.py",
            "DeepGEMM/third-party/cutlass/include/cute/a.hpp", "DeepGEMM/third-party/fmt/include/fmt/core.h",
            "DeepGEMM/third-party/tilelang_ops/t.py"} <= names
    assert not any("media" in n or n.endswith("README.md") or "src/x.cc" in n for n in names)
    assert commits.split() == ["DeepGEMM", dg, "CUTLASS", cut, "fmt", fmt]
