"""CPU checks of the split-K weight-streaming variant of the batched fp8 rowwise GEMM.

The kernels run in Triton's interpreter in a subprocess (TRITON_INTERPRET must be set before
triton is imported). What must hold whatever the split: every output written, the oracle matched,
the workspace back to zero after each call (the next call depends on it), and a second call on the
same workspace giving the same answer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skillrun_kernels.fp8_rowwise_batched_gemm import triton_sm90_splitk as splitk

TESTS = Path(__file__).resolve().parent

_CASES = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import interp_fixups  # noqa: F401
import torch
from skillrun_kernels.fp8_rowwise_batched_gemm import problem, triton_sm90_splitk as sk

cases = [
    # (shape, config): M=1 decode with 4 splits; ragged M/N with a K tail inside the last split;
    # more splits than K steps (clamped); SPLIT_K=1 (the one-pass schedule through this kernel); promoted.
    ({"batch": 2, "M": 1, "N": 32, "K": 256}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, SPLIT_K=4)),
    ({"batch": 3, "M": 20, "N": 48, "K": 208}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, SPLIT_K=2)),
    ({"batch": 2, "M": 5, "N": 32, "K": 64}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, SPLIT_K=8)),
    ({"batch": 2, "M": 17, "N": 32, "K": 128}, dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, SPLIT_K=1)),
    ({"batch": 2, "M": 3, "N": 32, "K": 256}, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=64, SPLIT_K=2, precise_acc=32)),
]
for ci, (shape, cfg) in enumerate(cases):
    launch = sk.build(shape, cfg, "cpu")
    for seed in (0, 1):
        inp = problem.make_inputs(shape, seed, "cpu")
        ref = problem.oracle(inp)
        prep = launch.prepare(inp)
        errs = []
        for call in range(2):
            out = torch.full((shape["batch"], shape["M"], shape["N"]), float("nan"), dtype=torch.bfloat16)
            res = launch.run(prep, out)
            errs.append(float((out.float() - ref).norm() / ref.norm()))
            written = bool(torch.isfinite(out).all())
            ws_zero = bool((prep["ws"].data == 0).all())
        print(json.dumps({"case": ci, "seed": seed, "rel_err": errs, "all_written": written,
                          "ws_zero": ws_zero, "same_tensor": res is out,
                          "splits": launch.describe["splits_used"]}))
"""


@pytest.fixture(scope="module")
def interp_results() -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CASES, str(TESTS)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 10, proc.stdout
    return rows


def test_splitk_matches_oracle_every_call(interp_results):
    for r in interp_results:
        assert r["all_written"], r
        assert r["same_tensor"], r
        assert max(r["rel_err"]) < 1e-2, r
        # a second call on the same workspace must not see the first call's sums
        assert abs(r["rel_err"][0] - r["rel_err"][1]) < 2e-3, r


def test_workspace_is_zero_after_each_call(interp_results):
    assert all(r["ws_zero"] for r in interp_results)


def test_split_counts_follow_the_plan(interp_results):
    by_case = {r["case"]: r["splits"] for r in interp_results}
    assert by_case == {0: 4, 1: 2, 2: 2, 3: 1, 4: 2}


@pytest.mark.parametrize("k,bk,split,expect", [
    (8192, 256, 4, (2048, 4)),   # the card's decode shape: four 2048-deep slices
    (8192, 128, 3, (2816, 3)),   # uneven: 22 + 22 + 20 steps
    (64, 32, 8, (32, 2)),        # more splits than steps: clamped, none empty
    (208, 64, 2, (128, 2)),      # K tail in the last slice
])
def test_split_plan(k, bk, split, expect):
    per, used = splitk.split_plan(k, bk, split)
    assert (per, used) == expect
    assert (used - 1) * per < k <= used * per  # every slice non-empty, K covered


@pytest.mark.parametrize("cfg,msg", [
    ({"SPLIT_K": 0}, "SPLIT_K"),
    ({"BLOCK_N": 96}, "power of two"),
    ({"BLOCK_K": 8}, "power of two"),
    ({"BLOCK_M": True}, "BLOCK_M"),
])
def test_bad_configs_are_rejected_at_build(cfg, msg):
    with pytest.raises(ValueError, match=msg):
        splitk.build({"batch": 2, "M": 1, "N": 32, "K": 64}, cfg, "cpu")


def test_tunable_values_each_run_from_the_default():
    # Changing one knob of the default must stay launchable, except where shared memory says no.
    for key, values in splitk.TUNABLE.items():
        for v in values:
            cfg = {**splitk.DEFAULT, key: v}
            if splitk.shared_bytes(cfg) <= splitk.SM90_SMEM_LIMIT:
                splitk.check_config(cfg, 8192)


def test_shared_memory_rule_agrees_with_the_compile_facts():
    # compile_sm90_splitk.json holds what ptxas reported (compile only, no GPU): the host rule must
    # predict every config's shared memory and reject exactly those over the limit.
    facts = json.loads((TESTS.parent / "kernels/skillrun_kernels/fp8_rowwise_batched_gemm/compile_sm90_splitk.json").read_text())
    assert facts["rows"]
    for row in facts["rows"]:
        dims, w, s, _ = row["config"].split("_")
        bm, bn, bk = (int(x) for x in dims.split("x"))
        cfg = {**splitk.DEFAULT, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_stages": int(s[1:])}
        assert splitk.shared_bytes(cfg) == row["shared_bytes"], row
        if row["fits_smem"]:
            splitk.check_config(cfg, 8192)
        else:
            with pytest.raises(ValueError, match="shared memory"):
                splitk.check_config(cfg, 8192)
