"""The routing side of `skill-run e2e`, inside the user's workload process.

The start-up hook (runner/skillrun/profiling/hook/sitecustomize.py) calls :func:`install` when the parent set
SKILLRUN_E2E_SPEC. Both arms run under the same machinery, so its Python cost is in both:

- arm A (as-is): a TorchDispatchMode watches the planned families' aten ops and counts the calls
  it *would* route; every call runs the original op.
- arm B (routed): the same mode hands the calls whose shape the plan selected to the recipe's
  kernel (the card's ``build(shape, config, device)``); every other call runs the original op.

Python-level targets (a family's ``route.PY_TARGETS``) are wrapped the same way. A wrapper hands
``route`` the original call as a thunk; arm A then runs it itself with the controller's "inside a
routed call" flag set, so the ops the original makes (a per-batch loop's ``_scaled_mm`` calls) are
not counted as routable a second time: arm B never makes them, it runs the port instead.

Oracle samples (``oracle`` > 0, the warm-up runs): the first ``oracle`` calls of each plan item
are checked against the family's fp32 oracle (``problem.oracle`` on the call's inputs, computed
before the call runs) within the card's tolerance, in both arms: arm B's port output, arm A's
original output. The record then says which arm is right, whatever the saved outputs say. The controller
also times the workload's steps (``skillrun.profiling.step()``), keeps the tensors it saves
(``skillrun.profiling.save_output``), notices torch.compile and CUDA graphs, and writes a status
file at exit that the parent reads. A routed kernel that raises is recorded before the exception
reaches the workload, so a workload that catches it still fails its arm.

Standard library at import; torch and the kernels are imported by :func:`install`.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import sys
import threading
import time
from typing import Any

CONTROLLER_KEY = "_skillrun_e2e_controller"  # same key as skillrun.profiling.E2E_KEY
MAX_OUTPUTS = 64
MAX_ERRORS = 20


class RoutedKernelError(Exception):
    """A routed kernel raised. Deliberately not a RuntimeError: workloads often catch those."""


def _write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, default=str)
    os.replace(tmp, path)


def _shape_text(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


class Controller:
    def __init__(self, spec: dict, arm: str, status_path: str, outputs_dir: str, save: bool = True, oracle: int = 0):
        self.arm = arm
        self.save = save and bool(outputs_dir)  # only the runs the parent compares keep their tensors
        self.routing = arm == "B"
        self.status_path = status_path
        self.outputs_dir = outputs_dir
        self.pid = os.getpid()
        self.t0 = time.perf_counter()
        self.step_marks: list[float] = []
        self.items = spec.get("items", [])
        self.lock = threading.RLock()
        # Per plan item: calls routed (B) or that would be routed (A); per (op, reason): passed through.
        self.item_calls: dict[str, int] = {it["id"]: 0 for it in self.items}
        self.oracle_left: dict[str, int] = {it["id"]: max(0, int(oracle)) for it in self.items}
        self.oracle_checks: list[dict] = []
        self.routed_by: dict[str, int] = {}  # aten op or Python target -> calls routed (B) / routable (A)
        self.passed: dict[tuple[str, str], int] = {}
        self.unplanned_shapes: dict[tuple[str, str], int] = {}
        self.errors: list[str] = []
        self.outputs: list[dict] = []
        self.outputs_not_kept = 0
        self.notes: list[str] = []
        self.compile_wrapped = 0
        self.compiled_calls = 0
        self.calls_in_compiled = 0
        self.graph_captures = 0
        self.routed_in_capture = 0
        self.graph_replays = 0
        self.threads_seen: set[int] = set()
        self._compiled_depth = threading.local()
        self._in_port = threading.local()
        self._launches: dict[tuple, Any] = {}
        self.launch_info: list[dict] = []
        self._prepared: dict[tuple, tuple] = {}
        self._finished = False
        self.torch = None
        self.routes: dict[str, Any] = {}  # route module name -> module
        self.by_route: dict[str, dict[tuple, dict]] = {}  # route module -> plan key -> item

    # ------------------------------------------------------------------ set-up
    def load_routes(self) -> None:
        import torch

        self.torch = torch
        for it in self.items:
            mod = self.routes.get(it["route"])
            if mod is None:
                mod = importlib.import_module(it["route"])
                self.routes[it["route"]] = mod
            key = tuple(mod.plan_key(it["shape"]))
            table = self.by_route.setdefault(it["route"], {})
            if key in table:
                self.notes.append(f"plan items {table[key]['id']} and {it['id']} select the same call shape; the first is used")
                continue
            table[key] = it

    def aten_watch(self) -> dict[Any, list[str]]:
        """OpOverload -> route modules watching it."""
        torch = self.torch
        watch: dict[Any, list[str]] = {}
        for name, mod in self.routes.items():
            for op in getattr(mod, "ATEN_OPS", ()):
                ns, _, opname = op.partition("::")
                packet = getattr(getattr(torch.ops, ns), opname)
                for ov in packet.overloads():
                    watch.setdefault(getattr(packet, ov), []).append(name)
        return watch

    def patch_python_targets(self) -> None:
        for name, mod in self.routes.items():
            for target, wrap in (getattr(mod, "PY_TARGETS", None) or {}).items():
                module_name, _, attr = target.partition(":")
                owner = importlib.import_module(module_name)
                original = getattr(owner, attr)
                setattr(owner, attr, wrap(original, lambda t, call, run_original=None, _n=name: self.route(_n, t, call, run_original)))

    # ------------------------------------------------------------------ routing
    def route(self, route_name: str, op: str, call: Any, original: Any = None) -> tuple[bool, Any]:
        """One intercepted call: (True, result) when it ran here (the port in arm B; in arm A the
        ``original`` thunk, when given), (False, None) when the caller must run the original."""
        if getattr(self._in_port, "n", 0):
            return False, None  # an op the port itself calls (from a Python-level target) is the port's business
        with self.lock:
            self.threads_seen.add(threading.get_ident())
            if getattr(self._compiled_depth, "n", 0):
                self.calls_in_compiled += 1
            if isinstance(call, str):
                self._count_passed(op, call)
                return False, None
            mod = self.routes[route_name]
            key = tuple(mod.plan_key(call.shape))
            item = self.by_route.get(route_name, {}).get(key)
            if item is None:
                self._count_passed(op, "shape not in the plan")
                k = (op, _shape_text(call.shape))
                self.unplanned_shapes[k] = self.unplanned_shapes.get(k, 0) + 1
                return False, None
            capturing = self._capturing()
            self.item_calls[item["id"]] += 1
            n_call = self.item_calls[item["id"]]
            self.routed_by[op] = self.routed_by.get(op, 0) + 1
            if capturing:
                self.routed_in_capture += 1
            sample = not capturing and self.oracle_left.get(item["id"], 0) > 0 and (self.routing or original is not None)
            if sample:
                self.oracle_left[item["id"]] -= 1
            if not self.routing and original is None:
                return False, None
        if not self.routing:
            return True, self._run_original(item, call, original, n_call if sample else 0)
        try:
            return True, self._run_port(item, call, n_call if sample else 0)
        except Exception as exc:  # noqa: BLE001 - recorded, then re-raised as a non-RuntimeError
            msg = (f"routed kernel {item['kernel_ref']} (card {item['card']}, recipe {item['recipe']}) raised at "
                   f"{_shape_text(call.shape)}{' during CUDA graph capture' if capturing else ''}: "
                   f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            with self.lock:
                if len(self.errors) < MAX_ERRORS:
                    self.errors.append(msg)
            self.write_status()
            raise RoutedKernelError(msg) from exc

    def _count_passed(self, op: str, reason: str) -> None:
        k = (op, reason)
        self.passed[k] = self.passed.get(k, 0) + 1

    def _capturing(self) -> bool:
        cuda = self.torch.cuda
        try:
            return bool(cuda.is_initialized() and cuda.is_current_stream_capturing())
        except Exception:  # noqa: BLE001
            return False

    def _launch(self, item: dict, shape: dict, device: str):
        key = (item["id"], tuple(sorted(shape.items())), device)
        launch = self._launches.get(key)
        if launch is None:
            module_name, _, attr = item["kernel_ref"].partition(":")
            build = getattr(importlib.import_module(module_name), attr)
            launch = build(dict(shape), dict(item.get("config") or {}), device)
            self._launches[key] = launch
            self.launch_info.append({"item": item["id"], "name": launch.name, "shape": dict(shape),
                                     "expect_kernels": launch.expect_kernels})
        return launch

    def _prepare(self, launch, item: dict, call) -> Any:
        if not call.static or call.refresh is None:
            return launch.prepare(call.inputs)
        ident = tuple((k, call.inputs[k].data_ptr(), tuple(call.inputs[k].shape), tuple(call.inputs[k].stride()),
                       call.inputs[k]._version) for k in call.static)
        key = (id(launch), ident)
        hit = self._prepared.get(key)
        if hit is not None:
            return call.refresh(hit[0], call.inputs)
        prepared = launch.prepare(call.inputs)
        # Keep the weights alive with their prepared form so a freed address is never reused as a key.
        self._prepared[key] = (prepared, [call.inputs[k] for k in call.static])
        return prepared

    def _run_port(self, item: dict, call, sample: int = 0) -> Any:
        device = call.out.device.type if hasattr(call.out, "device") else "cpu"
        flag = self._in_port
        flag.n = getattr(flag, "n", 0) + 1
        try:
            ref = self._oracle(item, call) if sample else None
            launch = self._launch(item, call.shape, device)
            prepared = self._prepare(launch, item, call)
            y = launch.run(prepared, call.out)
            if y is not None and y is not call.out:
                call.out.copy_(y)
            if sample:
                self._judge(item, call, ref, sample)
            return call.result(call.out)
        finally:
            flag.n -= 1

    def _run_original(self, item: dict, call, original, sample: int = 0) -> Any:
        """Arm A: the original call, with the ops it makes not counted again (they are its own)."""
        flag = self._in_port
        flag.n = getattr(flag, "n", 0) + 1
        try:
            ref = self._oracle(item, call) if sample else None
            value = original()
            if sample:
                # The op's result in the problem's layout: call.result(call.out) is the op-shaped
                # view of call.out; an op that returned a fresh tensor is copied into it.
                try:
                    target = call.result(call.out)
                    if value is not target and hasattr(value, "shape") and tuple(value.shape) == tuple(target.shape):
                        target.copy_(value)
                except Exception as exc:  # noqa: BLE001 - a check that cannot be made is recorded, not raised
                    ref = f"the original's result cannot be read as the problem's output: {type(exc).__name__}: {exc}"
                self._judge(item, call, ref, sample)
            return value
        finally:
            flag.n -= 1

    def _oracle(self, item: dict, call) -> Any:
        """The family's fp32 oracle for this call's inputs (before the call runs), or why there is none."""
        name = item.get("problem")
        if not name:
            return "the plan item names no problem module"
        torch = self.torch
        # The workload may have allowed TF32 (or lower) matmuls; the oracle is fp32 whatever it set.
        saved = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        try:
            torch.set_float32_matmul_precision("highest")
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            return importlib.import_module(name).oracle(call.inputs).float()
        except Exception as exc:  # noqa: BLE001
            return f"{name}.oracle raised: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        finally:
            torch.set_float32_matmul_precision(saved[0])
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[1], saved[2]

    def _judge(self, item: dict, call, ref: Any, n_call: int) -> None:
        row: dict[str, Any] = {"item": item["id"], "call": n_call, "shape": _shape_text(call.shape)}
        if isinstance(ref, str):
            row.update(passed=None, error=ref)
        else:
            try:
                from skillrun.execute.parity import compare, tolerance_of

                m = compare(call.out, ref, tolerance_of(item.get("tolerance")))
                row.update({k: m[k] for k in ("passed", "rel_fro", "max_abs_err", "cosine", "mismatched", "error") if k in m})
            except Exception as exc:  # noqa: BLE001
                row.update(passed=None, error=f"comparison raised: {type(exc).__name__}: {exc}")
        with self.lock:
            if len(self.oracle_checks) < 4 * MAX_OUTPUTS:
                self.oracle_checks.append(row)

    # ------------------------------------------------------------------ markers
    def step(self) -> None:
        torch = self.torch
        if torch is not None:
            try:
                if torch.cuda.is_initialized():
                    torch.cuda.synchronize()  # a step's time includes its kernels, in both arms
            except Exception:  # noqa: BLE001
                pass
        self.step_marks.append(time.perf_counter())

    def save_output(self, name: str, tensor: Any) -> None:
        torch = self.torch
        if torch is None or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"save_output({name!r}, ...) needs a torch.Tensor, got {type(tensor).__name__}")
        with self.lock:
            if not self.save:
                self.outputs_not_kept += 1
                return
            if len(self.outputs) >= MAX_OUTPUTS:
                if len(self.outputs) == MAX_OUTPUTS:
                    self.notes.append(f"more than {MAX_OUTPUTS} outputs saved; the rest were not kept")
                    self.outputs.append({"name": "(dropped)", "file": None})
                return
            base = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name))[:60] or "output"
            taken = {o["name"] for o in self.outputs}
            label, n = base, 1
            while label in taken:
                label, n = f"{base}#{n}", n + 1
            fname = f"{len(self.outputs):03d}.pt"
            torch.save(tensor.detach().to("cpu", copy=True), os.path.join(self.outputs_dir, fname))
            self.outputs.append({"name": label, "file": fname, "shape": list(tensor.shape), "dtype": str(tensor.dtype)})

    # ------------------------------------------------------------------ torch.compile and CUDA graphs
    def watch_compile_and_graphs(self) -> None:
        torch = self.torch
        original_compile = torch.compile
        ctl = self

        def compile(model=None, **kwargs):  # noqa: A001 - shadows torch.compile on purpose
            if model is None:  # @torch.compile(mode=...) form
                return lambda m: compile(m, **kwargs)
            fn = original_compile(model, **kwargs)
            ctl.compile_wrapped += 1
            if isinstance(model, torch.nn.Module) or not callable(fn):
                return fn  # a module keeps its type; its calls are not tracked one by one

            def compiled(*a, **kw):
                d = ctl._compiled_depth
                d.n = getattr(d, "n", 0) + 1
                ctl.compiled_calls += 1
                try:
                    return fn(*a, **kw)
                finally:
                    d.n -= 1

            return compiled

        torch.compile = compile
        graph_cls = getattr(torch.cuda, "CUDAGraph", None)
        if graph_cls is not None:
            replay, begin = graph_cls.replay, graph_cls.capture_begin

            def counted_replay(g, *a, **kw):
                ctl.graph_replays += 1
                return replay(g, *a, **kw)

            def counted_begin(g, *a, **kw):
                ctl.graph_captures += 1
                return begin(g, *a, **kw)

            graph_cls.replay, graph_cls.capture_begin = counted_replay, counted_begin

    # ------------------------------------------------------------------ status
    def status(self) -> dict:
        marks = self.step_marks
        return {
            "hook_ran": True, "pid": self.pid, "arm": self.arm, "routing": self.routing,
            "torch": getattr(self.torch, "__version__", None),
            "cuda_used": bool(self.torch is not None and self.torch.cuda.is_initialized()),
            "wall_s": time.perf_counter() - self.t0,
            "steps": len(marks),
            "step_s": [b - a for a, b in zip(marks, marks[1:])],
            "first_step_s": (marks[0] - self.t0) if marks else None,
            "item_calls": self.item_calls,
            "oracle_checks": self.oracle_checks,
            "routed_by": self.routed_by,
            "passed": [{"op": op, "reason": r, "calls": n} for (op, r), n in sorted(self.passed.items())],
            "unplanned_shapes": [{"op": op, "shape": s, "calls": n} for (op, s), n in sorted(self.unplanned_shapes.items())][:20],
            "errors": self.errors, "notes": self.notes, "outputs": self.outputs, "outputs_not_kept": self.outputs_not_kept, "launches": self.launch_info[:50],
            "dynamo_frames": self._dynamo_frames(),
            "compile": {"wrapped": self.compile_wrapped, "calls": self.compiled_calls, "routable_calls_inside": self.calls_in_compiled},
            "cuda_graphs": {"captures": self.graph_captures, "replays": self.graph_replays, "calls_in_capture": self.routed_in_capture},
            "threads": len(self.threads_seen),
            "finished": self._finished,
        }

    @staticmethod
    def _dynamo_frames() -> dict | None:
        dyn = sys.modules.get("torch._dynamo.utils")
        try:
            return dict(dyn.counters["frames"]) if dyn is not None else None
        except Exception:  # noqa: BLE001
            return None

    def write_status(self) -> None:
        if os.getpid() != self.pid or not self.status_path:
            return
        try:
            _write_json_atomic(self.status_path, self.status())
        except OSError as exc:
            sys.stderr.write(f"[skill-run e2e] could not write the status file: {exc}\n")

    def finish(self) -> None:
        if os.getpid() != self.pid:
            return
        self._finished = True
        self.write_status()


def _make_mode(ctl: Controller, watch: dict):
    from torch.utils._python_dispatch import TorchDispatchMode

    def bind(func, args, kwargs) -> dict:
        bound: dict[str, Any] = {}
        for i, arg in enumerate(func._schema.arguments):
            if i < len(args) and not arg.kwarg_only:
                bound[arg.name] = args[i]
            elif arg.name in kwargs:
                bound[arg.name] = kwargs[arg.name]
            elif arg.has_default_value():
                bound[arg.name] = arg.default_value
        return bound

    class RouteMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            names = watch.get(func)
            if names:
                op = func._schema.name
                bound = bind(func, args, kwargs)
                for name in names:
                    try:
                        call = ctl.routes[name].problem_call(op, bound)
                    except Exception as exc:  # noqa: BLE001 - a broken route module fails the arm, both arms
                        msg = f"route module {name} raised reading a {op} call: {type(exc).__name__}: {exc}"
                        if msg not in ctl.errors and len(ctl.errors) < MAX_ERRORS:
                            ctl.errors.append(msg)
                        raise RoutedKernelError(msg) from exc
                    if isinstance(call, str) and name != names[-1]:
                        continue  # another family may own it
                    routed, value = ctl.route(name, op, call, lambda: func(*args, **kwargs))
                    if routed:
                        return value
                    break
            return func(*args, **kwargs)

    return RouteMode()


def install(cfg: dict[str, str]) -> Controller:
    """Set routing up in this process (called by the start-up hook); returns the controller."""
    import atexit

    with open(cfg["spec"]) as fh:
        spec = json.load(fh)
    ctl = Controller(spec, cfg.get("arm", "A"), cfg.get("status", ""), cfg.get("outputs", ""), save=cfg.get("save", "1") == "1",
                     oracle=int(cfg.get("oracle") or 0) if str(cfg.get("oracle") or "0").isdigit() else 0)
    sys.modules[CONTROLLER_KEY] = ctl  # type: ignore[assignment]
    atexit.register(ctl.finish)
    ctl.write_status()  # early: the parent knows the hook ran even if the process dies later
    ctl.load_routes()
    ctl.watch_compile_and_graphs()
    ctl.patch_python_targets()
    watch = ctl.aten_watch()
    if watch:
        mode = _make_mode(ctl, watch)
        mode.__enter__()  # for the life of the process (this thread: the one running the workload)
        ctl._mode = mode
    ctl.write_status()
    return ctl
