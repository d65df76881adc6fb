"""The CPU-checkable pieces of issue 41's device run (benchmarks/device_issue41.sh): the script parses and
names files that exist; each stage, run with stand-in python3/nvidia-smi, leaves at most the 8 files the
device tool brings back; the shapes it tunes select the decode recipes that carry the levers as
tunable_kernels; and every candidate those spaces enumerate is a config the decode kernels accept
(a candidate the kernel would refuse wastes device time), or is pruned by the card's constraints.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_issue41.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_script_parses_and_names_what_exists():
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    text = SCRIPT.read_text()
    for path in ("benchmarks/bench_moe_decode_roof_sm90.py", "benchmarks/e2e_validate_sm90.sh",
                 "benchmarks/device_moe_fp8bs_sm90.sh", "benchmarks/device_deepgemm_build.sh", ".ci/device-env.sh",
                 "benchmarks/device_budget.sh"):
        assert path in text and (ROOT / path).exists(), path


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="no bash/timeout")
@pytest.mark.parametrize("stage", ["a16", "fp8", "e2e"])
def test_each_stage_brings_back_at_most_eight_files(tmp_path, stage):
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python3", "nvidia-smi"):
        (fake / name).write_text("#!/bin/sh\necho stand-in \"$@\"\nexit 0\n")
        (fake / name).chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "OUT": str(out), "STAGE": stage, "BUDGET_S": "200"}
    res = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8, files
    assert all(len(p.relative_to(out).parts) <= 3 for p in files), files
    assert (out / f"issue41_{stage}.tgz").is_file() and (out / f"issue41_{stage}.log").is_file()
    log = (out / f"issue41_{stage}.log").read_text()
    assert "stand-in" in log and f"stage {stage} done" in log


def _decode_spaces(card_id: str, shape: dict, recipe: str):
    from skillrun.kb import tunable as T
    from skillrun.kb.index import SkillIndex
    from skillrun.plan.select import select_recipe

    card = SkillIndex.load().skill(card_id)
    sel = select_recipe(card, shape, {"sm_count": 132}, arch="sm_90")
    assert sel.recipe.name == recipe and not sel.untuned
    spaces = T.kernel_spaces_of(card, recipe)
    assert spaces and all(ks.kernel.endswith("triton_sm90_decode:build") for ks in spaces)
    out = []
    for ks in spaces:
        keep, pruned = T.enumerate_candidates(dict(ks.config), ks.space, shape, {"sm_count": 132})
        out.append((ks, keep, pruned))
    return out


@pytest.mark.parametrize("shape,recipe", [
    ({"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 128}, "decode"),
    ({"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 32}, "decode"),
    ({"tokens": 1, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 128}, "decode_tiny_i2048"),
    ({"tokens": 1, "model_dim": 7168, "inter_dim": 512, "experts": 384, "topk": 8, "group_size": 32}, "decode_tiny_i512"),
])
def test_a16wi4_tune_candidates_are_configs_the_kernels_accept(shape, recipe):
    from skillrun_kernels.moe_a16wi4 import triton_sm90_decode as dec

    n = 0
    for ks, keep, pruned in _decode_spaces("triton_moe_a16wi4_sm90", shape, recipe):
        for cfg in keep:
            dec.resolve_config(shape, cfg)
            n += 1
        if shape["group_size"] != 128 and "scale_acc" in ks.space.knobs:  # pruned by the card's constraint
            assert pruned and all("group_size % 128" in why for _, why in pruned)
    assert 8 <= n <= 40  # a sweep that fits a device call


@pytest.mark.parametrize("tokens", [1, 16, 64])
def test_fp8_tune_candidates_are_configs_the_kernels_accept(tokens):
    from skillrun_kernels.fp8_blockscale_moe import triton_sm90_decode as dec

    shape = {"tokens": tokens, "model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8}
    n = 0
    for _ks, keep, pruned in _decode_spaces("triton_moe_fp8_blockscale_sm90", shape, "decode"):
        assert not pruned
        for cfg in keep:
            dec.resolve_config(shape, cfg)
            n += 1
    assert 8 <= n <= 30


def test_decode_builders_describe_themselves_in_json():
    import json

    from skillrun_kernels.fp8_blockscale_moe import triton_sm90_decode as fp8
    from skillrun_kernels.moe_a16wi4 import triton_sm90_decode as a16

    a = a16.build({"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 128},
                  a16.ABLATIONS["lean_t16"], "cpu")
    f = fp8.build({"tokens": 1, "model_dim": 7168, "inter_dim": 2048, "experts": 256, "topk": 8}, fp8.ABLATIONS["t1"], "cpu")
    for launch, n in ((a, 4), (f, 5)):
        d = json.loads(json.dumps(launch.describe))
        assert d["launches"] == n and d["bytes_model"]["roof_us"] > 0 and d["config"]
