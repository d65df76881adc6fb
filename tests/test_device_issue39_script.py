"""Issue 39's one-call device run, checked on the CPU: benchmarks/compare_runner_bench.py on small synthetic
runner and bench JSON of each family (agree, disagree beyond 3 %, within the runner's A/A floor, too short,
one side missing, the bench variant with the runner's config), benchmarks/bench_spread.py's choice of
shapes, and benchmarks/device_issue39.sh parsed and dry-run (DRY=1: every stage's command printed) on a
synthetic validate.json: it benches shapes the runner measured and leaves at most 8 files in $OUT.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPT = BENCH / "device_issue39.sh"
BS, RW, MOE = "triton_fp8_blockscale_gemm_sm90", "triton_fp8_rowwise_batched_gemm_sm90", "triton_moe_a16wi4_sm90"
MOE_SHAPE = {"tokens": 16, "model_dim": 7168, "inter_dim": 2048, "experts": 64, "topk": 8, "group_size": 32}
MOE_TEXT = "tokens=16,model_dim=7168,inter_dim=2048,experts=64,topk=8,group_size=32"


@pytest.fixture(scope="module")
def mods():
    sys.path.insert(0, str(BENCH))
    import bench_spread
    import compare_runner_bench

    yield bench_spread, compare_runner_bench
    sys.path.remove(str(BENCH))
    for m in ("bench_spread", "compare_runner_bench"):
        sys.modules.pop(m, None)


def runner_row(card, shape, ratio, port_ms=0.5, aa=0.2, ref="ref_a", others=()):
    refs = [{"name": ref, "production": True, "status": "ok", "speedup": ratio, "parity": True}]
    refs += [{"name": n, "production": False, "status": "ok", "speedup": r, "parity": True} for n, r in others]
    return {"card": card, "shape": shape, "recipe": "r", "verdict": "faster" if ratio > 1 else "slower", "speedup": ratio,
            "aa_noise_pct": aa, "port_median_ms": port_ms, "port_spread_pct": 1.0, "references": refs}


def bs_bench(shape, ratios, port_ms=0.5):
    return {"shape": list(shape), "slots": {"port": {"ms": port_ms}}, "port_repeat_ratio": 1.001,
            **{f"speedup_vs_{n}": r for n, r in ratios.items()}}


def grouped_bench(shape, ratios, port_ms=0.5, variants=None):
    """A row-wise or MoE bench row: the port (and lever variants: name -> (config, {ref: ratio}))."""
    impls = {"port": {"graph_ms": port_ms, "config": {"A": 1}}, "port_again": {"graph_ms": port_ms * 1.002}}
    sp = {}
    for n, r in ratios.items():
        impls[n] = {"graph_ms": port_ms * r}
        sp[f"{n}_graph"] = r
    for v, (cfg, vr) in (variants or {}).items():
        impls[v] = {"graph_ms": port_ms, "config": cfg}
        sp.update({f"{v}_vs_{n}_graph": r for n, r in vr.items()})
    return {"shape": shape, "impls": impls, "speedup": sp}


def run_compare(mods, tmp_path, rows, benches, configs=None):
    _, crb = mods
    v = tmp_path / "validate.json"
    v.write_text(json.dumps(rows))
    args = ["--validate", str(v), "--out", str(tmp_path / "out.json")]
    for i, b in enumerate(benches):
        p = tmp_path / f"bench_{i}.json"
        p.write_text(json.dumps(b))
        args += ["--bench", str(p)]
    if configs is not None:
        (tmp_path / "cfg.json").write_text(json.dumps(configs))
        args += ["--runner-configs", str(tmp_path / "cfg.json")]
    rc = crb.main(args)
    out = json.loads((tmp_path / "out.json").read_text())
    return rc, {(r["family"], r["shape"]): r for r in out["rows"]}, out


@pytest.mark.parametrize("family", ["blockscale", "rowwise_batched", "moe_a16wi4"])
def test_each_family_agrees_disagrees_floor_too_short_and_one_side(mods, tmp_path, family):
    if family == "blockscale":
        card = BS
        shapes = [{"M": 4096, "N": n, "K": 7168} for n in (1024, 2048, 3072, 4096, 5120, 6144)]
        text = [f"4096,{s['N']},7168" for s in shapes]
        bench = lambda s, r, ms=0.5: bs_bench((s["M"], s["N"], s["K"]), {"ref_a": r}, ms)  # noqa: E731
        wrap = lambda rows: {"table": rows, "winners": {}}  # noqa: E731
    else:
        card = RW if family == "rowwise_batched" else MOE
        key = "M" if family == "rowwise_batched" else "tokens"
        base = {"batch": 16, "M": 1, "N": 1280, "K": 8192} if family == "rowwise_batched" else MOE_SHAPE
        shapes = [{**base, key: m} for m in (1, 32, 128, 512, 1024, 4096)]
        text = [",".join(f"{k}={v}" for k, v in s.items()) for s in shapes]
        bench = lambda s, r, ms=0.5: grouped_bench(s, {"ref_a": r}, ms)  # noqa: E731
        wrap = lambda rows: {"table": rows}  # noqa: E731
    rows = [runner_row(card, shapes[0], 1.02),                      # bench 1.00: +2 %, agrees
            runner_row(card, shapes[1], 1.05),                      # +5 %, beyond 3 %
            runner_row(card, shapes[2], 1.05, aa=6.0),              # +5 %, inside the runner's 6 % A/A floor
            runner_row(card, shapes[3], 1.30, port_ms=0.02),        # 20 us port: not compared, not passed
            runner_row(card, shapes[4], 1.0)]                       # the bench never timed it
    table = [bench(s, 1.0) for s in shapes[:4]] + [bench(shapes[5], 1.1)]  # the runner never timed shapes[5]
    rc, by, out = run_compare(mods, tmp_path, rows, [wrap(table)])
    assert rc == 1  # one disagreement
    st = {t: by[(family, t)]["status"] for t in text if (family, t) in by}
    assert st == {text[0]: "agree", text[1]: "disagree", text[2]: "agree", text[3]: "too_short",
                  text[4]: "runner_only", text[5]: "bench_only"}
    assert by[(family, text[0])]["reference"] == "ref_a" and by[(family, text[0])]["diff_pct"] == pytest.approx(2.0)
    assert by[(family, text[1])]["tolerance_pct"] == 3.0 and by[(family, text[2])]["tolerance_pct"] == 6.0
    assert by[(family, text[3])]["agree"] is None
    assert out["summary"]["counts"] == {"agree": 2, "disagree": 1, "too_short": 1, "runner_only": 1, "bench_only": 1}
    # without the disagreeing shape the comparison passes
    rc, _, _ = run_compare(mods, tmp_path, [r for i, r in enumerate(rows) if i != 1], [wrap(table)])
    assert rc == 0


def test_the_reference_is_the_first_both_sides_timed_and_others_are_kept(mods, tmp_path):
    s = {"batch": 16, "M": 128, "N": 1280, "K": 8192}
    row = runner_row(RW, s, 0.76, ref="mslk_rowwise_batched", others=[("scaled_mm_loop", 4.8), ("scaled_grouped_mm", 0.8)])
    # the bench has no MSLK (not installed there): the loop is the reference both measured
    b = grouped_bench(s, {"scaled_mm_loop": 4.7, "scaled_grouped_mm": 0.81})
    rc, by, _ = run_compare(mods, tmp_path, [row], [{"table": [b]}])
    r = by[("rowwise_batched", "batch=16,M=128,N=1280,K=8192")]
    assert rc == 0 and r["reference"] == "scaled_mm_loop" and r["bench_key"] == "scaled_mm_loop_graph"
    assert [o["reference"] for o in r["others"]] == ["scaled_grouped_mm"]
    # no reference on both sides: listed as such, not dropped
    b2 = grouped_bench(s, {"dequant": 2.0})
    rc, by, _ = run_compare(mods, tmp_path, [row], [{"table": [b2]}])
    assert rc == 0 and by[("rowwise_batched", "batch=16,M=128,N=1280,K=8192")]["status"] == "no_common_reference"


def test_the_bench_variant_with_the_runners_config_is_compared(mods, tmp_path):
    row = runner_row(MOE, MOE_SHAPE, 2.24, ref="mslk_bf16i4_shuffled_grouped")
    # the bench's own port is another config (1.2x); its lever row port_magic is the runner's kernel (2.2x)
    b = grouped_bench(MOE_SHAPE, {"mslk_bf16i4_shuffled_grouped": 1.2},
                      variants={"port_magic": ({"A": 1, "int4_cvt": "magic"}, {"mslk_bf16i4_shuffled_grouped": 2.2})})
    cfg = [{"card": MOE, "shape": MOE_TEXT, "kernel": "k", "config": {"int4_cvt": "magic"}}]
    rc, by, _ = run_compare(mods, tmp_path, [row], [{"table": [b]}], configs=cfg)
    r = by[("moe_a16wi4", MOE_TEXT)]
    assert rc == 0 and r["bench_variant"] == "port_magic" and r["same_config"] is True and r["status"] == "agree"
    # without the runner's configs: the port, flagged unknown, and the 1.2x disagrees
    rc, by, _ = run_compare(mods, tmp_path, [row], [{"table": [b]}])
    r = by[("moe_a16wi4", MOE_TEXT)]
    assert rc == 1 and r["bench_variant"] == "port" and r["same_config"] is None and r["status"] == "disagree"


def test_missing_bench_files_and_rows_the_runner_did_not_measure_are_listed(mods, tmp_path):
    _, crb = mods
    v = tmp_path / "v.json"
    v.write_text(json.dumps([runner_row(BS, {"M": 64, "N": 128, "K": 256}, 1.0),
                             {"card": BS, "shape": "128,128,256", "verdict": "not run", "reason": "device-call budget"},
                             runner_row("triton_moe_fp8_blockscale_sm90", {"tokens": 1}, 2.0)]))
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"table": [bs_bench((128, 128, 256), {"ref_a": 1.0})]}))
    out = tmp_path / "o.json"
    assert crb.main(["--validate", str(v), "--bench", str(b), "--bench", str(tmp_path / "cut.json"), "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    st = {r["shape"]: (r["status"], r.get("note", "")) for r in d["rows"]}
    assert st["64,128,256"][0] == "runner_only"
    assert st["128,128,256"] == ("bench_only", "runner: not run (device-call budget)")
    assert st["tokens=1"][0] == "runner_only" and "no bench" in st["tokens=1"][1]
    assert d["summary"]["missing_inputs"] == [f"{tmp_path / 'cut.json'}: FileNotFoundError"]


def test_the_spread_prefers_measured_shapes_and_fills_from_the_defaults(mods):
    bs_, _ = mods
    from recipe_shapes import card_cases

    for fam, card in bs_.CARDS.items():  # the defaults are recipe shapes the runner's --first can name
        assert set(bs_.DEFAULT[fam]) <= {s for s, _ in card_cases(card, untuned=True)}, fam
    assert bs_.LARGE == ["4096,65536,1536", "4096,2048,7168", "16384,1536,7168", "16384,7168,768", "8192,8192,8192"]
    rows = [runner_row(RW, {"batch": 16, "M": m, "N": 8192, "K": 1024}, 1.0, port_ms=ms) for m, ms in ((512, 0.2), (4096, 0.9))]
    rows += [runner_row(RW, {"batch": 16, "M": 8192, "N": 8192, "K": 1024}, 1.0, port_ms=2.0)]  # not in the bench's list
    rows += [{"card": RW, "shape": "batch=16,M=32,N=1280,K=8192", "verdict": "error"}]
    got = bs_.pick(rows, "rowwise_batched")
    assert [(p["shape"], p["measured"]) for p in got] == [("batch=16,M=4096,N=8192,K=1024", True),
                                                          ("batch=16,M=512,N=8192,K=1024", True)]
    got = bs_.pick(rows[:1], "rowwise_batched")
    assert [(p["shape"], p["measured"]) for p in got] == [("batch=16,M=512,N=8192,K=1024", True),
                                                          (bs_.DEFAULT["rowwise_batched"][0], False)]
    assert bs_.invocations({"rowwise_batched": got})[1:] == [["rowwise_batched", "--n", "8192", "--m", "512"],
                                                             ["rowwise_batched", "--n", "1280", "--m", "128"]]


def test_the_rowwise_and_moe_benches_read_the_runners_configs(tmp_path):
    pytest.importorskip("torch")
    sys.path.insert(0, str(BENCH))
    try:
        import bench_fp8_rowwise_batched_sm90 as rw
        import bench_moe_a16wi4_sm90 as moe
    finally:
        sys.path.remove(str(BENCH))
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps([
        {"card": RW, "shape": "batch=16,M=128,N=1280,K=8192", "kernel": "skillrun_kernels.fp8_rowwise_batched_gemm.triton_sm90:build",
         "config": {"BLOCK_M": 64}},
        {"card": RW, "shape": "batch=16,M=1,N=1280,K=8192", "kernel": "skillrun_kernels.fp8_rowwise_batched_gemm.triton_sm90_splitk:build",
         "config": {"SPLIT_K": 4}},
        {"card": MOE, "shape": MOE_TEXT, "kernel": "skillrun_kernels.moe_a16wi4.triton_sm90:build", "config": {"int4_cvt": "magic"}},
        {"card": BS, "shape": "4096,2048,7168", "kernel": "x", "config": {}}]))
    assert rw.runner_configs(cfg) == {"128,1280,8192": ("port", {"BLOCK_M": 64}), "1,1280,8192": ("splitk", {"SPLIT_K": 4})}
    assert moe.runner_configs(cfg) == {(16, 7168, 2048, 64, 8, 32): {"int4_cvt": "magic"}}


pytestmark_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")


@pytestmark_bash
def test_the_script_parses_and_names_what_exists():
    res = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    text = SCRIPT.read_text()
    for path in ("benchmarks/device_measure_all_sm90.sh", "benchmarks/bench_spread.py", "benchmarks/validate_recipes.py",
                 "benchmarks/bench_fp8_blockscale_sm90.py", "benchmarks/bench_fp8_rowwise_batched_sm90.py",
                 "benchmarks/bench_moe_a16wi4_sm90.py", "benchmarks/compare_runner_bench.py", ".ci/device-env.sh"):
        assert path in text and (ROOT / path).exists(), path
    assert 'run(kind="nvidia-h200", timeout_s=600, carry=[".whl", ".cache/compile"]' in text
    assert "STAGES='sandbox runner bench compare gpu_tests' BUDGET_S=570 bash benchmarks/device_issue39.sh" in text
    assert "MANIFEST_IN" in text and "timeout" in text and "pytest -m gpu" in text


@pytestmark_bash
def test_the_dry_run_benches_shapes_the_runner_measured_and_stays_within_8_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    rows = [runner_row(BS, {"M": m, "N": n, "K": k}, 0.9) for m, n, k in ((4096, 65536, 1536), (4096, 2048, 7168),
                                                                          (16384, 1536, 7168), (16384, 7168, 768), (8192, 8192, 8192))]
    rows += [runner_row(RW, {"batch": 16, "M": m, "N": 8192, "K": 1024}, 1.1, port_ms=0.3) for m in (512, 4096)]
    rows += [runner_row(MOE, {**MOE_SHAPE, "group_size": 128, "tokens": t}, 2.0, port_ms=0.7) for t in (64, 1024)]
    rows += [{"card": MOE, "shape": MOE_TEXT, "verdict": "not run", "reason": "device-call budget"}]
    (out / "validate.json").write_text(json.dumps(rows))
    env = {**os.environ, "OUT": str(out), "DRY": "1", "PY": sys.executable, "BUDGET_S": "570"}
    res = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    dry = [ln for ln in res.stderr.splitlines() if ln.startswith("DRY [")]
    stages = {"device_measure_all_sm90.sh": "runner", "--emit-configs": "configs", "bench_fp8_blockscale_sm90.py": "bs",
              "bench_fp8_rowwise_batched_sm90.py": "rw", "bench_moe_a16wi4_sm90.py": "moe",
              "compare_runner_bench.py": "compare", "-m pytest -m gpu": "gpu", "sandbox.gpu_fit": "sandbox"}
    seen = [next(v for k, v in stages.items() if k in ln) for ln in dry]
    assert seen == ["sandbox", "runner", "configs", "bs", "rw", "moe", "compare", "gpu"]
    line = dict(zip(seen, dry))
    # the runner's --first is the default spread; the benches take the shapes the runner measured
    assert "FIRST=triton_fp8_blockscale_gemm_sm90:4096,65536,1536" in line["runner"]
    assert "--shapes 4096x65536x1536,4096x2048x7168,16384x1536x7168,16384x7168x768,8192x8192x8192 --configs" in line["bs"]
    assert re.search(r"--n 8192 --m 512 4096 --configs \S+runner_configs.json", line["rw"])
    assert re.search(r"--combos 64x2048 --tokens 64 1024 --group-size 128 --configs", line["moe"])
    assert "group-size 32" not in line["moe"]  # the shape the runner did not run (budget) is not benched
    assert "--n 1280" not in res.stderr  # nor the row-wise defaults: the runner measured two it can run
    assert line["compare"].count("--bench ") == 3 and "--runner-configs" in line["compare"]
    # every stage bounded: the limits sum inside the budget
    # every stage bounded: the stages' limits sum inside the budget (the benches share the bench stage's end)
    caps = [int(re.match(r"DRY \[(\d+)s\]", ln).group(1)) for ln, st in zip(dry, seen) if st not in ("configs", "bs", "rw", "moe")]
    assert sum(caps) + 180 + 15 <= 570  # + BENCH_S and the packing at the end
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 1 <= len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in files)
    assert {"device_issue39.log", "validate.json", "extras.tgz", "evidence.tgz"} <= {p.name for p in files}
