"""The isolated parity gate, decided where no port can reach: the judge is not the accused.

A port is untrusted code, and whatever runs in its process can be rewritten by it (the oracle, the
comparison, torch's own operators, the result file). So a candidate task (harness phase A, the
tuner's gates) runs as two children of the parent:

  accused  (worker.candidate)  builds the kernel, prepares and runs it once per seed, and hands each
           output over as raw bytes plus what it saw (its input checksums after the call, the run
           time); only an exact ``torch.Tensor`` is accepted, read with torch functions disabled,
           so a subclass that computes when looked at is refused by name.
  judge    (judge_task)        a process that never imported the port (a fresh interpreter, or a
           fork of the zygote, which imports no kernel module): regenerates each seed's inputs from
           the problem module, computes the fp32 oracle, its own input checksums and the
           comparison from the bytes, as a tensor it rebuilt itself. The problem module is run from
           the bytes the parent read before any port of the run was imported (:func:`pin_problem`),
           and the judge refuses to judge if the file no longer holds them (a port that appended
           code to it, even one that restores it byte for byte later, changes nothing the judge runs).

The parent (``isolate.run_task``) starts both and takes nothing about correctness from the accused: its
result's parity, flops and byte counts are dropped and replaced by the judge's. A seed with no
output handed over fails. What the accused reports that the judge cannot recompute (its input
checksums after the call, build and run seconds) is its word, used only against it.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from skillrun.execute import integrity, parity

# The dtypes an output may be handed over as (anything else is refused before it is read).
_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
           "float8_e5m2fnuz", "int64", "int32", "int16", "int8", "uint8", "bool", "complex64", "complex128")
_META_MAX = 1 << 20


def _names(seed: int) -> tuple[str, str]:
    return f"seed_{int(seed)}.bin", f"seed_{int(seed)}.json"


def output_files(folder: str | Path, seed: int) -> tuple[Path, Path]:
    """The two files one handed-over output takes (its bytes, its description)."""
    return tuple(Path(folder, n) for n in _names(seed))  # type: ignore[return-value]


def plain(out: Any) -> Any:
    """``out`` if it is an exact, strided ``torch.Tensor``; else TypeError naming what it is."""
    import torch

    if type(out) is not torch.Tensor:
        raise TypeError(f"the output is a {type(out).__module__}.{type(out).__qualname__}, not a plain torch.Tensor "
                        "(a subclass can run code when it is looked at): return the output buffer itself")
    if out.layout is not torch.strided:
        raise TypeError(f"the output has layout {out.layout}, not a plain strided torch.Tensor")
    return out


def write_output(folder: str | Path, seed: int, out: Any, meta: dict) -> None:
    """The accused's side: the output's bytes and what it saw, for the judge (``plain`` first)."""
    import torch

    plain(out)
    with torch._C.DisableTorchFunctionSubclass():
        t = out.detach().contiguous().reshape(-1)
        data = t.view(torch.uint8).cpu().numpy().tobytes() if t.numel() else b""
    binf, metaf = _names(seed)
    Path(folder).mkdir(parents=True, exist_ok=True)
    Path(folder, binf).write_bytes(data)
    Path(folder, metaf).write_text(json.dumps({**meta, "dtype": str(out.dtype).removeprefix("torch."),
                                               "shape": [int(s) for s in out.shape]}))


def write_refusal(folder: str | Path, seed: int, reason: str, meta: dict) -> None:
    """The accused's side when its output cannot be handed over (not a plain tensor)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    Path(folder, _names(seed)[1]).write_text(json.dumps({**meta, "refused": str(reason)[:1000]}))


def _read_regular(path: Path, max_bytes: int) -> bytes:
    # O_NONBLOCK: a FIFO left where an output should be would block a plain open until someone writes
    # it (the referee's thread, for good); opened this way it returns at once and is refused below.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        if st.st_size > max_bytes:
            raise ValueError(f"{path.name} is {st.st_size} bytes, larger than the {max_bytes} an output of this problem can be")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(max_bytes + 1)
    finally:
        os.close(fd)


def read_output(folder: str | Path, seed: int, max_bytes: int) -> tuple[Any, dict]:
    """The judge's side: (a tensor rebuilt here from the bytes, the accused's metadata).

    ValueError when there is nothing to read or it does not describe itself consistently."""
    import torch

    binf, metaf = _names(seed)
    try:
        meta = json.loads(_read_regular(Path(folder, metaf), _META_MAX))
    except FileNotFoundError:
        raise ValueError("no output was handed over for this seed (the port's process ended or wrote elsewhere)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"unreadable output description: {exc}") from None
    if not isinstance(meta, dict):
        raise ValueError("unreadable output description: not an object")
    if meta.get("refused"):
        raise ValueError(str(meta["refused"])[:1000])
    name, shape = meta.get("dtype"), meta.get("shape")
    if name not in _DTYPES or not hasattr(torch, name):
        raise ValueError(f"output dtype {name!r} is not a tensor dtype the judge reads")
    if not isinstance(shape, list) or len(shape) > 8 or not all(type(s) is int and 0 <= s < 2**40 for s in shape):
        raise ValueError(f"output shape {shape!r} is not a list of sizes")
    dtype = getattr(torch, name)
    numel = 1
    for s in shape:
        numel *= s
    want = numel * torch.empty(0, dtype=dtype).element_size()
    try:
        data = _read_regular(Path(folder, binf), max_bytes)
    except FileNotFoundError:
        raise ValueError("no output was handed over for this seed (its description has no bytes)") from None
    if len(data) != want:
        raise ValueError(f"the output's bytes ({len(data)}) do not match its shape {shape} of {name} ({want} bytes)")
    if not numel:
        return torch.empty(shape, dtype=dtype), meta
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape), meta


# ------------------------------------------------------------------------------------------------
# the judge's code is pinned: the problem module as the parent read it before any port ran

PROBLEM_MAX_BYTES = 1 << 20


class ProblemChanged(RuntimeError):
    """The problem module's file is not what the parent pinned: the judge refuses to judge."""


def pin_problem(name: str) -> dict:
    """The problem module's source as the parent reads it now, before a port of this run is imported:
    ``{"module", "path", "sha256", "source"}``. Its package is imported to find it; the module is not."""
    import hashlib
    import importlib
    import importlib.machinery

    # Found on the file system (not through sys.modules, which holds the pinned module of an earlier run).
    parent, _, leaf = name.rpartition(".")
    path = importlib.import_module(parent).__path__ if parent else None
    spec = importlib.machinery.PathFinder.find_spec(leaf, path)
    if spec is None or not spec.origin or not str(spec.origin).endswith(".py"):
        raise ImportError(f"problem module {name} has no Python source to pin")
    data = _read_regular(Path(spec.origin), PROBLEM_MAX_BYTES)
    return {"module": name, "path": str(spec.origin), "sha256": hashlib.sha256(data).hexdigest(),
            "source": data.decode("utf-8")}


def check_pin(pin: dict) -> None:
    """ProblemChanged unless the problem module's file still holds the pinned bytes."""
    import hashlib

    try:
        now = hashlib.sha256(_read_regular(Path(pin["path"]), PROBLEM_MAX_BYTES)).hexdigest()
    except (OSError, ValueError) as exc:
        now = f"unreadable ({exc})"
    if now != pin["sha256"]:
        raise ProblemChanged(f"the problem module {pin['path']} changed while the candidates ran (sha256 "
                             f"{pin['sha256'][:12]}… pinned before any port was imported, {now[:12]}… now): "
                             "refusing to judge with it")


def load_problem(name: str, pin: dict | None = None) -> Any:
    """The problem module, executed from the pinned bytes (never from the file as it is now, nor from a
    module some earlier import left in ``sys.modules``); ProblemChanged if the file no longer matches the
    pin. Without a pin (a caller that had none) the file is pinned now."""
    import importlib.util
    import sys
    import types

    pin = pin or pin_problem(name)
    if pin.get("module") != name:
        raise ProblemChanged(f"the pin is of {pin.get('module')!r}, not of the problem {name!r}")
    check_pin(pin)
    mod = types.ModuleType(name)
    mod.__file__ = pin["path"]
    mod.__package__ = name.rpartition(".")[0]
    mod.__spec__ = importlib.util.spec_from_file_location(name, pin["path"])
    sys.modules[name] = mod  # anything that imports the problem by name from here on gets this one
    exec(compile(pin["source"], pin["path"], "exec"), mod.__dict__)  # noqa: S102 - the project's own, pinned source
    return mod


def judge_task(task: dict) -> dict:
    """The judge child: oracle, checksums and comparison for every seed the accused was given."""
    import torch

    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = task["device"]
    try:
        problem = load_problem(task["problem"], task.get("problem_pin"))
    except ProblemChanged as exc:
        return {"status": "error", "error": str(exc)}
    shape = dict(task["shape"])
    tol = parity.tolerance_of(task.get("tolerance"))
    res: dict[str, Any] = {"status": "ok", "flops": float(problem.flops(shape)), "min_bytes": float(problem.min_bytes(shape))}
    per_seed = []
    for seed in task["seeds"]:
        inputs = problem.make_inputs(shape, seed, device)
        try:
            ref = parity.oracle_of(problem, task["problem"], shape, inputs, seed)
        except parity.DegenerateInput as exc:
            return {"status": "error", "input_error": True, "error": str(exc)}
        before = integrity.digests(inputs)
        try:
            out, meta = read_output(task["handover"], seed, max_bytes=max(1, ref.numel()) * 16)
        except ValueError as exc:
            per_seed.append({"seed": seed, "passed": False, "error": f"not judged: {exc}"})
            continue
        m = parity.compare(out.to(ref.device), ref, tol)
        m.update(seed=seed, poison=meta.get("poison"), wrote_into_out=bool(meta.get("wrote_into_out")),
                 run_s=meta.get("run_s") if isinstance(meta.get("run_s"), (int, float)) else None)
        after = meta.get("after_digests")
        after = {str(k): tuple(v) for k, v in after.items()} if isinstance(after, dict) else {}
        mutated = integrity.changed(before, after)
        if mutated:
            m["passed"] = False
            m["input_mutation"] = mutated
            m["error"] = (f"the candidate wrote to its input operand(s) {', '.join(mutated)} (checksum of the bytes "
                          "before prepare() differs from after run())" + (f"; {m['error']}" if m.get("error") else ""))
        per_seed.append(m)
        del inputs, ref, out
    agg = parity.aggregate(per_seed)
    agg["supported"] = True
    agg["judge"] = "a separate process that never imported the port, from the output bytes it handed over"
    res["parity"] = agg
    return res
