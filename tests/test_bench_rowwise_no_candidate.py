"""The row-wise bench's candidate sweep when a shape leaves nothing to time (issue 24).

On the H200, `bench_fp8_rowwise_batched_sm90.py --splitk-sweep` died with ZeroDivisionError at
M=32, N=8192, K=1024: every split-K candidate was rejected and the timing loop was handed an empty
set. The sweep must instead return no best config and say why (CPU, no kernel runs: the builders
here raise or give wrong results on purpose).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
bench = pytest.importorskip("bench_fp8_rowwise_batched_sm90")

SHAPE = {"batch": 2, "M": 3, "N": 32, "K": 64}


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setattr(bench, "DEV", "cpu")
    monkeypatch.setattr(bench.tm, "DRY_RUN_CPU", True)


def _raises(shape, cfg, device):
    raise ValueError(f"SPLIT_K={cfg['SPLIT_K']} exceeds the K steps")


class _Wrong:
    def __init__(self, shape, cfg, device):
        self.prepare = lambda inp: inp

    def run(self, prepared, out):
        out.fill_(1.0)  # finite, but not the product
        return out


def _key(cfg):
    return f"sk{cfg['SPLIT_K']}"


@pytest.mark.parametrize("builder,configs,expect", [
    (_raises, [{"SPLIT_K": 2}, {"SPLIT_K": 4}], ["none of 2 candidate configs survived", "2 raised", "SPLIT_K=2 exceeds"]),
    (_Wrong, [{"SPLIT_K": 2}], ["none of 1 candidate configs survived", "1 failed the oracle", "rel_fro"]),
    (_raises, [], ["no candidate config for this shape"]),
])
def test_a_sweep_with_nothing_to_time_says_why_instead_of_dividing_by_zero(cpu, builder, configs, expect):
    sw = bench.sweep_candidates(SHAPE, builder, configs, _key, bench.tm.L2Flush(), reps=2)
    assert sw["best"] is None and sw["best_config"] is None
    assert all(e in sw["no_candidate"] for e in expect), sw["no_candidate"]
    assert set(sw["candidates"]) == {_key(c) for c in configs}  # every rejected config kept with its reason
