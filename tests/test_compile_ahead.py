"""Compile ahead (runner/skillrun/execute/compile_ahead.py): a call's Triton kernels compiled for sm_90a on
the CPU, in parallel, into a folder keyed by the compiler and the kernel source, which a later process
(a device call's children) finds in Triton's own cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from defects.kb import card, make_defect_kb  # noqa: E402
from skillrun.execute import compile_ahead  # noqa: E402
from skillrun.execute.childproc import child_env  # noqa: E402
from skillrun.kb.index import SkillIndex  # noqa: E402

SMALL = {"BM": 32, "BN": 32, "BK": 32, "num_warps": 4, "num_stages": 2}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    c = card("toy_compile_ahead", "defects.toy_triton:build", backend="triton")
    c["recipes"][0]["config"] = dict(SMALL)
    root = make_defect_kb(tmp_path_factory.mktemp("ca_kb"), [c])
    idx = SkillIndex.load(root)
    assert not idx.errors, [str(e) for e in idx.errors]
    return idx


@pytest.fixture(scope="module")
def compiled(index, tmp_path_factory):
    shapes = [("toy_compile_ahead", {"M": 64, "N": 64, "K": 64}), ("toy_compile_ahead", {"M": 128, "N": 64, "K": 64}),
              ("toy_compile_ahead", {"M": 64, "N": 64, "K": 64})]
    jobs = compile_ahead.jobs_for(index, shapes)
    root = tmp_path_factory.mktemp("cache")
    return jobs, root, compile_ahead.compile_ahead(jobs, root, workers=2)


def test_a_calls_kernels_compile_once_into_a_folder_keyed_by_compiler_and_source(compiled):
    jobs, root, first = compiled
    assert len(jobs) == 2  # the same shape twice is one job
    assert all(j["ref"] == "defects.toy_triton:build" and j["config"] == SMALL and len(j["source"]) == 64 for j in jobs)
    assert first["compiled"] == 2 and first["failed"] == 0, first
    folder = Path(first["dir"])
    manifest = json.loads((folder / compile_ahead.MANIFEST).read_text())["jobs"]
    # compiled from the port's own launch (run on CPU tensors, the JIT's compile request sent to sm_90a)
    assert {m["how"] for m in manifest.values()} == {"launch"}
    assert folder.name == f"sm_90a-triton-{compile_ahead.compiler_version()}"
    assert list(folder.rglob("*.cubin"))  # Triton's own cache entries
    assert {m["source"] for m in manifest.values()} == {jobs[0]["source"]}
    again = compile_ahead.compile_ahead(jobs, root, workers=2)
    assert again["compiled"] == 0 and again["skipped"] == 2
    # an edited kernel source is another job: compiled again, never served a stale binary by the manifest
    edited = [{**j, "source": "0" * 64} for j in jobs[:1]]
    edited[0]["key"] = compile_ahead.job_key(edited[0])
    assert compile_ahead.compile_ahead(edited, root, workers=1)["compiled"] == 1


def test_a_launch_path_that_needs_a_gpu_falls_back_to_compile_only(compiled, tmp_path):
    jobs, _, _ = compiled
    job = {**jobs[0], "ref": "defects.toy_triton:build_gpu_only"}
    job["key"] = compile_ahead.job_key(job)
    done = compile_ahead.compile_ahead([job], tmp_path, workers=1)
    assert done["compiled"] == 1, done
    entry = json.loads((Path(done["dir"]) / compile_ahead.MANIFEST).read_text())["jobs"][job["key"]]
    assert entry["how"].startswith("compile_only (") and "needs a CUDA device" in entry["how"]


def test_a_later_process_finds_the_compiles_in_tritons_cache(compiled):
    jobs, _, done = compiled
    code = ("import json, sys; from skillrun.execute import compile_ahead as c; "
            "print(json.dumps(c._compile(json.loads(sys.argv[1]))))")
    env = {**child_env(), "TRITON_CACHE_DIR": done["dir"]}  # this process's import path (tests/ for defects)
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(jobs[0])], capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["status"] == "ok" and res["hits"] >= 1 and res["misses"] == 0, json.dumps(res)


def _hit_in(folder: str, job: dict) -> dict:
    code = ("import json, sys; from skillrun.execute import compile_ahead as c; "
            "print(json.dumps(c._compile(json.loads(sys.argv[1]))))")
    env = {**child_env(), "TRITON_CACHE_DIR": folder}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(job)], capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_carried_folder_is_relocated_and_pruned_to_what_a_launch_loads(compiled, tmp_path):
    import shutil

    jobs, root, done = compiled
    here = tmp_path / "here"
    shutil.copytree(root, here)
    compile_ahead.relocate(compile_ahead.cache_dir(here))
    stale, moved = tmp_path / "stale", tmp_path / "moved"
    shutil.copytree(here, stale)
    shutil.copytree(here, moved)
    shutil.rmtree(here)  # the folder was carried away: the paths Triton wrote are gone
    # Triton names its files by absolute path: without relocation the carried copy serves nothing
    assert _hit_in(str(compile_ahead.cache_dir(stale)), jobs[1])["misses"] >= 1
    folder = compile_ahead.cache_dir(moved)
    before = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert compile_ahead.prune(folder) > before / 2  # cubin + metadata only, relocated
    assert all(f.suffix in compile_ahead.LAUNCH_FILES or f.name.startswith("__grp__") for f in folder.rglob("*") if f.is_file())
    grp = next(folder.glob("*/__grp__*.json"))
    assert all(p.startswith(str(folder)) for p in json.loads(grp.read_text())["child_paths"].values())
    # what a launch loads is there: the same kernel compiled again is a cache hit
    code = ("import json, sys; from triton import knobs; seen = []; "
            "knobs.compilation.listener = lambda cache_hit, **_: seen.append(cache_hit); "
            "from defects import toy_triton; toy_triton.launch_only(json.loads(sys.argv[1]), json.loads(sys.argv[2])); "
            "print(json.dumps(seen))")
    env = {**child_env(), "TRITON_CACHE_DIR": str(folder)}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(jobs[1]["shape"]), json.dumps(jobs[1]["config"])],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True]


def test_the_folder_to_carry_is_printed_for_a_device_script(tmp_path, capsys):
    assert compile_ahead.main(["--cache", str(tmp_path), "--print-dir"]) == 0
    assert capsys.readouterr().out.strip() == str(compile_ahead.cache_dir(tmp_path))


def test_each_job_ran_in_a_sandboxed_child(compiled):
    """A job builds and runs the port (untrusted code) on CPU tensors: it does so inside the sandbox, as a task
    child would, writing only the carried folder."""
    from skillrun.io import sandbox

    _, _, done = compiled
    manifest = json.loads((Path(done["dir"]) / compile_ahead.MANIFEST).read_text())["jobs"]
    want = {"full": "full", "partial": "partial", "none": "partial"}[sandbox.support()["level"]]
    assert {m.get("sandbox") for m in manifest.values()} == {want}


def _in_sandbox(role: str, seed: str, job: dict, tmp_path: Path) -> dict:
    code = ("import json, os, sys; from skillrun.io import sandbox; "
            "info = sandbox.enter([sys.argv[2]], role=sys.argv[3], mode='auto'); "
            "from skillrun.execute import compile_ahead as c; res = c._compile(json.loads(sys.argv[1])); "
            "res['cache'] = os.environ['TRITON_CACHE_DIR']; res['copied'] = info.get('compile_seed'); print(json.dumps(res))")
    (tmp_path / "own").mkdir(exist_ok=True)
    env = {**child_env(), "SKILLRUN_COMPILE_SEED": seed, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop("TRITON_INTERPRET", None)
    env.pop("TRITON_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", code, json.dumps(job), str(tmp_path / "own"), role], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_sandboxed_port_process_takes_the_carried_compiles_into_its_own_cache_and_a_reference_takes_none(compiled, tmp_path):
    """The sandbox gives each role its own compile cache (a port can poison none a reference reads); a carried folder
    compiled ahead seeds the accused's (skillrun.io.compile_seed), whose launches are then cache hits."""
    jobs, _, done = compiled
    acc = _in_sandbox("accused", done["dir"], jobs[0], tmp_path)
    assert acc["copied"] and acc["hits"] >= 1 and acc["misses"] == 0, acc
    assert acc["cache"].startswith(str(tmp_path / "xdg")) and not acc["cache"].startswith(done["dir"])
    ref = _in_sandbox("reference", done["dir"], jobs[0], tmp_path)
    assert not ref["copied"] and ref["misses"] >= 1, ref


def test_the_seed_copies_what_a_cache_lacks_relocated_and_nothing_twice(compiled, tmp_path):
    """What a card's server does before each task (worker.main), so compiles done while the GPU measures arrive."""
    from skillrun.io import compile_seed

    _, _, done = compiled
    dest = tmp_path / "role"
    entries = [d for d in Path(done["dir"]).iterdir() if d.is_dir()]
    assert compile_seed.seed(dest, done["dir"]) == len(entries) > 0
    groups = list(dest.glob("*/__grp__*.json"))
    assert groups and all(p.startswith(str(dest)) for g in groups for p in json.loads(g.read_text())["child_paths"].values())
    assert compile_seed.seed(dest, done["dir"]) == 0


def test_a_gpu_runs_left_out_pieces_do_not_reach_the_compile_jobs(index, tmp_path, monkeypatch):
    """A GPU run whose device needed a piece of the sandbox left out (SKILLRUN_SANDBOX_WITHOUT, set by the harness
    in its own environment) still compiles ahead in the full sandbox: a compile job never touches the device."""
    from skillrun.io import sandbox

    if sandbox.support()["level"] != "full":
        pytest.skip("needs the full sandbox")
    monkeypatch.setenv(sandbox.WITHOUT_ENV, "landlock")
    jobs = compile_ahead.jobs_for(index, [("toy_compile_ahead", {"M": 64, "N": 64, "K": 64})])
    done = compile_ahead.compile_ahead(jobs, tmp_path / "cache", workers=1)
    manifest = json.loads((Path(done["dir"]) / compile_ahead.MANIFEST).read_text())["jobs"]
    assert {m.get("sandbox") for m in manifest.values()} == {"full"}
