"""Compile ahead, off the GPU's clock: every kernel variant a call will need, on the host's CPU cores.

Triton compiles for sm_90a on a machine without a GPU (its bundled ptxas). A cache entry serves a
launch only if its key (kernel source, argument types and specialisations, constexprs, options,
target) is the one the launch computes, so each job compiles what the port's own launch asks for:

* **by launch** (first choice): the port is built and run on CPU tensors at the real shape with a
  stand-in sm_90 driver, and Triton's JIT cache hook compiles each kernel the launch requests for
  sm_90a instead of launching it: the specialisations are the JIT's own (the port's ``compile_only``
  did not produce the same key for the block-scale port, checked with this very hook);
* **by compile_only** (fallback, when the launch path cannot run on the CPU: a CUDA-only call, inputs
  too large for the host, no Triton launch seen): ``compile_only(shape, config, arch)``
  (kernels/skillrun_kernels/protocol.py), which may or may not produce the launch's key.

Run before a device call (on CI, or on the device's host while the GPU measures, all cores in
parallel), the compiles land in Triton's own on-disk cache; the runner's children find them there
when they launch (``TRITON_CACHE_DIR``), and no shape spends device time compiling.

The folder is keyed by what makes a compiled kernel reusable:

* **the compiler**: ``<root>/<target>-triton-<version>`` (Triton's ptxas ships with it); a new Triton
  gets a new folder, never a stale binary;
* **the kernel source**: a manifest (``skillrun-compile-ahead.json``) records each job (kernel
  ref, shape, config, target) with its kernel source identity (evidence/kernel_sources.py); a
  job whose identity is recorded is not compiled again, and Triton's own cache key (source hash,
  options, target) decides the rest.

Triton's cache records its files by absolute path (``__grp__*.json``), so a folder carried to
another machine or path must be relocated before use (:func:`relocate`; validate_recipes does it,
``--relocate`` on the command line); ``--prune`` keeps only what a launch loads (the cubin and its
metadata), about a fifth of the size, for a device call's carry limit.

Whether the device's launches were served by it is measured, not assumed: each task child records
Triton's cache hits and misses (worker.py, ``compile_cache`` in the artifact's ``cost``).

    python -m skillrun.execute.compile_ahead --cache .cache/compile triton_fp8_blockscale_gemm_sm90 \
        triton_moe_a16wi4_sm90:tokens=16,model_dim=7168,inter_dim=2048,experts=64,topk=8,group_size=128
    export TRITON_CACHE_DIR=$(python -m skillrun.execute.compile_ahead --cache .cache/compile --print-dir)
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MANIFEST = "skillrun-compile-ahead.json"
BACKENDS = ("triton", "gluon")
DEFAULT_TARGET = "sm_90a"


def compiler_version() -> str:
    try:
        import importlib.metadata as md

        return md.version("triton")
    except Exception:  # noqa: BLE001 - no Triton: nothing can be compiled ahead
        return "none"


def cache_dir(root: str | Path, target: str = DEFAULT_TARGET) -> Path:
    """The folder for this compiler and target under ``root`` (what TRITON_CACHE_DIR should be)."""
    return Path(root) / f"{target}-triton-{compiler_version()}"


def job_key(job: dict[str, Any]) -> str:
    ident = {k: job.get(k) for k in ("ref", "shape", "config", "target", "source")}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


def jobs_for(index: Any, targets: list[tuple[str, dict[str, int]]], target: str = DEFAULT_TARGET) -> list[dict[str, Any]]:
    """One job per (card, shape) whose selected recipe is a Triton/Gluon port with ``compile_only``:
    its kernel ref, config and source identity at that shape (the recipe the runner picks for sm_90)."""
    from skillrun.evidence.kernel_sources import source_identity
    from skillrun.plan.select import select_recipe

    arch = target.rstrip("a")
    jobs, seen = [], set()
    for card_id, shape in targets:
        card = index.skill(card_id)
        sel = select_recipe(card, dict(shape), index.device_facts(arch), arch)
        r = sel.recipe
        if r.backend not in BACKENDS:
            continue
        ident, _ = source_identity(r.kernel)
        job = {"card": card_id, "recipe": r.name, "ref": r.kernel, "shape": dict(shape), "config": dict(r.config),
               "problem": card.references.get("problem"),
               "target": target, "source": ident.get("kernel_source_sha256"),
               "sources": sorted((ident.get("kernel_sources") or {}).items()) if isinstance(ident.get("kernel_sources"), dict) else None}
        key = job_key(job)
        if key not in seen:
            seen.add(key)
            jobs.append({**job, "key": key})
    return jobs


# The launch path runs on host memory: inputs beyond this (a MoE layer's experts) fall back to compile_only.
LAUNCH_MAX_BYTES = int(os.environ.get("SKILLRUN_COMPILE_AHEAD_MAX_BYTES", str(4 << 30)))


class _NotByLaunch(Exception):
    pass


def _by_launch(job: dict[str, Any]) -> int:
    """Build and run the port on CPU tensors with a stand-in sm_90 driver; each kernel launch is compiled
    for the target by Triton's JIT cache hook instead of launched. Returns the kernels compiled."""
    import torch
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime import jit as jitmod
    from triton.runtime.driver import driver

    problem = importlib.import_module(job["problem"]) if job.get("problem") else None
    if problem is None:
        raise _NotByLaunch("no problem module")
    need = float(problem.min_bytes(dict(job["shape"]))) if hasattr(problem, "min_bytes") else 0.0
    if need * 3 > LAUNCH_MAX_BYTES:
        raise _NotByLaunch(f"inputs of ~{need / 2**30:.1f} GiB are too large for the host")
    from skillrun_kernels._triton.compile import capability

    target = GPUTarget("cuda", capability(job["target"]), 32)

    class StandIn:  # what JITFunction.run asks of the active driver before it compiles
        def get_current_target(self):
            return target

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            return torch.device("cpu")

    options: list = []
    asked = {"n": 0}
    orig = jitmod.JITFunction._call_hook

    def call_hook(self, hook, key, signature, device, constants, opts, configs, is_warmup):
        options[:] = [opts]  # the launch's own parsed options, for the compile below
        return orig(self, hook, key, signature, device, constants, opts, configs, is_warmup)

    def compile_instead(*, fn, compile, **_: Any) -> bool:
        src = ASTSource(fn.jit_function, compile["signature"], compile["constants"], compile["configs"][0])
        triton.compile(src, target=target, options=options[0].__dict__)
        asked["n"] += 1
        return True  # compiled, not launched

    driver.set_active(StandIn())
    jitmod.JITFunction._call_hook = call_hook
    knobs.runtime.jit_cache_hook = compile_instead
    try:
        mod, _, fn = job["ref"].partition(":")
        launch = getattr(importlib.import_module(mod), fn)(dict(job["shape"]), dict(job["config"]), "cpu")
        inputs = problem.make_inputs(dict(job["shape"]), 1, "cpu")
        prepared = launch.prepare(inputs) if getattr(launch, "prepare", None) else inputs
        launch.run(prepared, problem.output_like(dict(job["shape"]), "cpu"))
    except Exception as exc:  # noqa: BLE001 - a launch path that needs a GPU: compile_only instead
        if not asked["n"]:
            raise _NotByLaunch(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    finally:
        knobs.runtime.jit_cache_hook = None
        jitmod.JITFunction._call_hook = orig
    if not asked["n"]:
        raise _NotByLaunch("its launch on the CPU asked for no Triton kernel")
    return asked["n"]


def _compile(job: dict[str, Any]) -> dict[str, Any]:
    """One job in a worker process: the kernels the port's launch asks for (by launch), else its compile_only."""
    t0 = time.perf_counter()
    seen = {"hits": 0, "misses": 0}
    try:
        from triton import knobs

        def listener(*, cache_hit: bool, **_: Any) -> None:
            seen["hits" if cache_hit else "misses"] += 1

        knobs.compilation.listener = listener
    except Exception:  # noqa: BLE001 - an older Triton without the listener: counts stay zero
        pass
    try:
        n = _by_launch(job)
        return {"key": job["key"], "status": "ok", "how": "launch", "kernels_compiled": n,
                "seconds": round(time.perf_counter() - t0, 2), **seen}
    except _NotByLaunch as exc:
        why = str(exc)
    except Exception as exc:  # noqa: BLE001 - the compile itself failed: that is the job's error
        return {"key": job["key"], "status": "error", "how": "launch", "seconds": round(time.perf_counter() - t0, 2),
                "error": f"{type(exc).__name__}: {str(exc)[-400:]}", **seen}
    try:
        module = importlib.import_module(job["ref"].split(":")[0])
        if not callable(getattr(module, "compile_only", None)):
            raise TypeError(f"{job['ref']} has no compile_only(shape, config, arch)")
        from skillrun_kernels._triton.compile import port_facts

        facts = port_facts(module, job["shape"], job["config"], job["target"])
        kernels = [{k: v for k, v in kern.items() if k in ("name", "regs", "shared_bytes", "spill_store_bytes")}
                   for kern in facts.get("kernels") or []]
        return {"key": job["key"], "status": "ok", "how": f"compile_only ({why})", "seconds": round(time.perf_counter() - t0, 2),
                "kernels": kernels, **seen}
    except Exception as exc:  # noqa: BLE001 - a port that does not compile is reported, the others go on
        return {"key": job["key"], "status": "error", "seconds": round(time.perf_counter() - t0, 2),
                "error": f"{type(exc).__name__}: {str(exc)[-400:]}", **seen}


# What a launch from the cache loads (triton.compiler.CompiledKernel: the binary and its metadata).
LAUNCH_FILES = (".cubin", ".hsaco", ".json")


def relocate(folder: str | Path) -> int:
    """Point every cache group of ``folder`` at the files where they are now (Triton writes absolute
    paths, so a carried folder would miss every entry); returns the groups rewritten."""
    from skillrun.io import compile_seed

    return compile_seed.relocate(folder)


def prune(folder: str | Path) -> int:
    """Keep only what a launch loads (LAUNCH_FILES) in every cache entry, then relocate; returns the bytes freed.
    compile_only cannot read its facts from a pruned entry, so the manifest keeps the jobs done."""
    freed = 0
    for f in Path(folder).glob("*/*"):
        if f.is_file() and not f.name.startswith("__grp__") and f.suffix not in LAUNCH_FILES:
            freed += f.stat().st_size
            f.unlink()
    relocate(folder)
    return freed


JOB_TIMEOUT_S = 1800.0


def sandboxed(job: dict[str, Any], folder: str | Path, timeout_s: float = JOB_TIMEOUT_S) -> dict[str, Any]:
    """One job (:func:`_compile`) in a fresh interpreter that enters the sandbox before it imports Triton or the
    port (skillrun.io.sandbox, the accused's role, this folder as its Triton cache and the only place it may
    write), with no interpreter mode; its result, or the error its end says."""
    from skillrun.execute.childproc import child_env, describe_exit
    from skillrun.io import lifeline

    with lifeline.temp_dir("compile") as tmp:
        spec = Path(tmp) / "job.json"
        spec.write_text(json.dumps(job))
        env = child_env({"TRITON_INTERPRET": None})
        try:
            out = subprocess.run([sys.executable, "-m", "skillrun.execute.compile_ahead", "--job", str(spec), "--cache", str(folder)],
                                 capture_output=True, text=True, env=env, timeout=timeout_s, start_new_session=True)
        except subprocess.TimeoutExpired:
            return {"key": job["key"], "status": "error", "error": f"the compile did not finish within {timeout_s:g} s"}
        except OSError as exc:
            return {"key": job["key"], "status": "error", "error": f"cannot start the compile child: {exc}"}
    lines = [ln for ln in out.stdout.strip().splitlines() if ln.startswith("{")]
    try:
        res = json.loads(lines[-1])
        if isinstance(res, dict) and res.get("key") == job["key"] and res.get("status") in ("ok", "error"):
            return res
    except (ValueError, IndexError):
        pass
    return {"key": job["key"], "status": "error",
            "error": f"worker died: {describe_exit(out.returncode) if out.returncode else 'no result'}: {out.stderr[-300:]}"}


def _job_main(spec: str, folder: str) -> int:
    """The compile child: the sandbox, then the job (see :func:`sandboxed`)."""
    from skillrun.io import lifeline, sandbox

    pid_text = os.environ.get(lifeline.PARENT_ENV, "")
    parent = int(pid_text) if pid_text.isdigit() else None
    job = json.loads(Path(spec).read_text())
    # without=(): a compile job runs the port's launch on CPU tensors with a stand-in driver, never the device,
    # so nothing the device needed left out of a GPU run's sandbox (SKILLRUN_SANDBOX_WITHOUT) is left out here.
    info = sandbox.enter([folder], role="accused", mode="auto", parent=parent, without=(),
                         deathsig=os.environ.get(lifeline.DEATHSIG_ENV) == "1", triton_cache=folder)
    if not info.get("lifeline") and parent is not None:
        lifeline.die_with_parent(parent)
    os.environ.pop("TRITON_INTERPRET", None)
    res = _compile(job)
    res["sandbox"] = info.get("level")
    print(json.dumps(res), flush=True)
    return 0


def _read_manifest(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / MANIFEST).read_text())
        return data if isinstance(data, dict) and isinstance(data.get("jobs"), dict) else {"jobs": {}}
    except (OSError, ValueError):
        return {"jobs": {}}


def compile_ahead(jobs: list[dict[str, Any]], root: str | Path, *, workers: int | None = None,
                  target: str = DEFAULT_TARGET, log: Any = None, on_done: Any = None) -> dict[str, Any]:
    """Compile every job not already in the folder's manifest, ``workers`` at a time (default: every
    CPU core); returns the summary (folder, compiled, skipped, failed, seconds) and updates the manifest.
    ``on_done(key, result)`` is told of each job as it finishes (a measuring loop waiting for its own)."""
    folder = cache_dir(root, target)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(folder)
    todo = [j for j in jobs if manifest["jobs"].get(j["key"], {}).get("status") != "ok"]
    for j in jobs:
        if j not in todo and on_done is not None:
            on_done(j["key"], manifest["jobs"][j["key"]])
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    if todo:
        n = max(1, min(len(todo), workers or os.cpu_count() or 1))
        # Each job builds and runs the port (untrusted code) on CPU tensors: in a child of its own that enters the
        # sandbox first, as every task child does, and may write the carried folder only (sandboxed()).
        with cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="compile-ahead") as ex:
            futs = {ex.submit(sandboxed, j, folder): j for j in todo}
            for fut in cf.as_completed(futs):
                job = futs[fut]
                try:
                    res = fut.result()
                except Exception as exc:  # noqa: BLE001 - a worker that died (an abort in the compiler)
                    res = {"key": job["key"], "status": "error", "error": f"worker died: {type(exc).__name__}: {exc}"}
                results.append(res)
                if on_done is not None:
                    on_done(job["key"], res)
                manifest["jobs"][job["key"]] = {**{k: job.get(k) for k in ("card", "recipe", "ref", "shape", "config", "target", "source")},
                                                **{k: v for k, v in res.items() if k != "key"},
                                                "compiler": compiler_version(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                if log:
                    log(f"[compile-ahead] {job['card']} {job['recipe']} {job['shape']}: {res['status']} by {res.get('how', '?')} "
                        f"{res.get('seconds', '?')} s" + (f" ({res.get('error')})" if res.get("error") else ""))
        tmp = folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, folder / MANIFEST)
    failed = [r for r in results if r["status"] != "ok"]
    return {"dir": str(folder), "compiler": compiler_version(), "target": target, "jobs": len(jobs),
            "compiled": len(results) - len(failed), "skipped": len(jobs) - len(todo), "failed": len(failed),
            "seconds": round(time.perf_counter() - t0, 2), "errors": [r.get("error") for r in failed][:10]}


def parse_targets(index: Any, args: list[str]) -> list[tuple[str, dict[str, int]]]:
    """``card`` (every shape its tests.selects cases list) or ``card:shape``, as benchmarks/validate_recipes.py takes them."""
    from skillrun.kb.cards import problem_keys
    from skillrun.plan.select import parse_shape

    out = []
    for a in args:
        card_id, _, text = a.partition(":")
        card = index.skill(card_id)
        keys = problem_keys(card)
        if text:
            out.append((card_id, parse_shape(text, keys)))
            continue
        for case in (card.data.get("tests") or {}).get("selects") or []:
            shape = case["shape"]
            sd = dict(zip(keys, (int(v) for v in shape))) if isinstance(shape, list) else {k: int(v) for k, v in shape.items()}
            if (card_id, sd) not in out:
                out.append((card_id, sd))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", help="card or card:shape (as benchmarks/validate_recipes.py)")
    ap.add_argument("--cache", required=True, help="the carried folder (a subfolder per target and compiler is used)")
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--workers", type=int, default=None, help="parallel compiles (default: every CPU core)")
    ap.add_argument("--print-dir", action="store_true",
                    help="relocate the folder (see --relocate), print it (what TRITON_CACHE_DIR should be), and exit")
    ap.add_argument("--relocate", action="store_true", help="rewrite the cache's file paths for where the folder is now")
    ap.add_argument("--prune", action="store_true", help="after compiling, keep only what a launch loads (for carrying)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--job", help=argparse.SUPPRESS)  # one job, in a sandboxed child (sandboxed())
    a = ap.parse_args(argv)
    if a.job:
        return _job_main(a.job, a.cache)
    if a.print_dir or a.relocate:
        folder = cache_dir(a.cache, a.target)
        n = relocate(folder) if folder.is_dir() else 0
        print(folder if a.print_dir else f"relocated {n} cache entries in {folder}")
        return 0
    from skillrun.kb.index import SkillIndex

    index = SkillIndex.load()
    jobs = jobs_for(index, parse_targets(index, a.targets), a.target)
    summary = compile_ahead(jobs, a.cache, workers=a.workers, target=a.target,
                            log=None if a.json else (lambda m: print(m, file=sys.stderr, flush=True)))
    if a.prune:
        summary["pruned_bytes"] = prune(summary["dir"])
    print(json.dumps(summary) if a.json else
          f"compile-ahead: {summary['compiled']} compiled, {summary['skipped']} already in {summary['dir']}, "
          f"{summary['failed']} failed, {summary['seconds']} s")
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
