"""Building and launching one kernel in a task child: what the candidate, the probe and the session's
slot processes share (worker.py, slot_server.py)."""
from __future__ import annotations

import time
from typing import Any

from skillrun.execute import integrity
from skillrun.kb.refs import resolve


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "model_dump"):
        return _jsonable(obj.model_dump(mode="json"))
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return _jsonable(asdict(obj))
    return str(obj)


def _sync(device: str):
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def _build(ref: str, shape: dict, config: dict, device: str):
    from skillrun.execute.cost import TASK, watch_compiles
    from skillrun_kernels.protocol import KernelLaunch

    prev = TASK.mark("imports")  # the kernel module and what it imports
    builder = resolve(ref)
    watch_compiles()  # Triton's cache hits and misses from here on (a carried compile cache, compile_ahead.py)
    TASK.mark(prev)
    t0 = time.perf_counter()
    launch = builder(dict(shape), dict(config or {}), device)
    if not isinstance(launch, KernelLaunch):
        raise TypeError(f"{ref} returned {type(launch).__name__}, not a KernelLaunch (kernels/skillrun_kernels/protocol.py)")
    return launch, time.perf_counter() - t0


def _describe(launch) -> dict:
    return {"name": launch.name, "expect_kernels": launch.expect_kernels, "describe": _jsonable(launch.describe)}


def _run_once(launch, prepared, out, sync):
    res = launch.run(prepared, out)
    sync()
    return out if res is None else res


def _fp32_oracle_precision() -> None:
    """The oracle's fp32 matmul must be real fp32 on a GPU, not TF32 (a site default could change it)."""
    import torch

    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _storage_bytes(objs) -> int:
    seen, total = set(), 0
    for t in integrity.tensors_in(objs):
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total



def _aa_copy(fn):
    import functools

    p = functools.partial(fn)
    p.aa_copy = True
    return p
