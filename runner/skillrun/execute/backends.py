"""Backends: what runs where, behind one interface.

=========  ==================================  ===================================  ===========
backend    port (recipe backend)               reference slots                      timing
=========  ==================================  ===================================  ===========
cuda       triton / torch, on the NVIDIA GPU   ``references.baseline.cuda`` + alts   device events
rocm       flydsl / triton / torch, AMD GPU    ``references.baseline.rocm`` + alts   device events
cpu        triton via the interpreter, torch;  ``references.baseline.cpu`` + alts    none (no GPU)
           flydsl: compile-only check           marked ``device: cpu``
=========  ==================================  ===================================  ===========

Every backend imports torch lazily (only ``detect`` touches it), and Triton/FlyDSL are imported
only inside child processes, so the runner works on machines that lack either.
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from skillrun.errors import UnavailableError, UsageError


@dataclass
class DeviceFacts:
    kind: str  # cuda | rocm | cpu
    name: str
    arch: str | None = None
    sm_count: int | None = None
    cu_count: int | None = None
    l2_bytes: int | None = None
    memory_bytes: int | None = None
    driver: str | None = None
    runtime: str | None = None

    def artifact(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("memory_bytes",)}
        return d

    def predicate_facts(self) -> dict[str, Any]:
        """What a recipe predicate may read (models.DEVICE_KEYS)."""
        out: dict[str, Any] = {}
        if self.sm_count:
            out["sm_count"] = self.sm_count
        if self.cu_count:
            out["cu_count"] = self.cu_count
        if self.l2_bytes:
            out["l2_mb"] = round(self.l2_bytes / 2**20)
        return out


def _cmd(args: list[str]) -> str | None:
    if not shutil.which(args[0]):
        return None
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip().splitlines()[0].strip() if r.returncode == 0 and r.stdout.strip() else None


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def detect_facts(kind: str | None = None) -> DeviceFacts:
    """The device the harness will use: the GPU torch sees (CUDA or ROCm), else the CPU."""
    try:
        import torch
    except ImportError:
        torch = None
    has_gpu = bool(torch is not None and torch.cuda.is_available())
    is_hip = bool(torch is not None and getattr(torch.version, "hip", None))
    if kind in (None, "auto"):
        kind = ("rocm" if is_hip else "cuda") if has_gpu else "cpu"
    if kind not in ("cuda", "rocm", "cpu"):
        raise UsageError(f"unknown backend {kind!r}", field="backend", hint="cuda, rocm, cpu or auto")
    if kind == "cpu":
        return DeviceFacts(kind="cpu", name=_cpu_name(), arch=platform.machine(),
                           runtime=f"torch {torch.__version__} (CPU)" if torch is not None else None)
    if not has_gpu or (kind == "rocm") != is_hip:
        have = ("ROCm" if is_hip else "CUDA") + " GPU" if has_gpu else "no GPU"
        raise UnavailableError(f"backend {kind!r} needs a {'ROCm' if kind == 'rocm' else 'CUDA'} GPU; this machine has {have}",
                               hint="use --backend cpu for numerics/compile-only checks")
    props = torch.cuda.get_device_properties(0)
    facts = DeviceFacts(kind=kind, name=props.name, memory_bytes=int(props.total_memory),
                        l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0) or None)
    if kind == "cuda":
        facts.arch = f"sm_{props.major}{props.minor}"
        facts.sm_count = int(props.multi_processor_count)
        facts.runtime = f"CUDA {torch.version.cuda}"
        drv = _cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        facts.driver = f"NVIDIA {drv}" if drv else None
    else:
        facts.arch = str(getattr(props, "gcnArchName", "") or "").split(":")[0] or None
        facts.cu_count = int(props.multi_processor_count)
        facts.runtime = f"HIP {torch.version.hip}"
        try:
            facts.driver = "amdgpu " + open("/sys/module/amdgpu/version").read().strip()
        except OSError:
            facts.driver = None
    return facts


@dataclass
class Backend:
    facts: DeviceFacts
    notes: list[str] = field(default_factory=list)

    kind: ClassVar[str] = "abstract"
    torch_device: ClassVar[str] = "cpu"
    runs: ClassVar[tuple[str, ...]] = ("torch",)  # recipe backends whose ports run here
    compiles: ClassVar[tuple[str, ...]] = ()  # recipe backends checked compile-only here

    def port_mode(self, recipe_backend: str | None) -> tuple[str, str]:
        """("run" | "compile" | "skip", why)."""
        rb = recipe_backend or "torch"
        if rb in self.runs:
            return "run", f"{rb} port runs on {self.kind}"
        if rb in self.compiles:
            return "compile", f"{rb} port: compile-only check ({self._needs(rb)} is needed to run it)"
        return "skip", f"a {rb} port cannot run on the {self.kind} backend (needs {self._needs(rb)})"

    @staticmethod
    def _needs(rb: str) -> str:
        return {"flydsl": "an AMD GPU (ROCm)", "ck": "an AMD GPU (ROCm)", "triton": "a GPU, or the CPU interpreter",
                "cublas": "an NVIDIA GPU", "gluon": "an NVIDIA GPU (Gluon has no interpreter)"}.get(rb, "a GPU")

    def baseline_ref(self, references: dict[str, Any]) -> str | None:
        return (references.get("baseline") or {}).get(self.kind)

    def alternatives(self, references: dict[str, Any]) -> list[dict[str, Any]]:
        return [a for a in references.get("alternatives") or [] if a.get("device") in (None, self.kind)]

    def env(self, recipe_backend: str | None) -> dict[str, str | None]:
        return {"TRITON_INTERPRET": None}

    def default_timer(self) -> str | None:
        return "event"

    @property
    def gpu(self) -> bool:
        return self.kind in ("cuda", "rocm")


class CudaBackend(Backend):
    kind = "cuda"
    torch_device = "cuda"
    runs = ("triton", "gluon", "torch", "cublas")
    compiles = ()


class RocmBackend(Backend):
    kind = "rocm"
    torch_device = "cuda"  # torch addresses HIP devices as "cuda"
    runs = ("flydsl", "triton", "torch", "ck")
    compiles = ()


class CpuBackend(Backend):
    kind = "cpu"
    torch_device = "cpu"
    runs = ("triton", "torch")
    compiles = ("flydsl",)

    def alternatives(self, references: dict[str, Any]) -> list[dict[str, Any]]:
        # GPU references would only report "unsupported" here; CPU ones must say so explicitly.
        return [a for a in references.get("alternatives") or [] if a.get("device") == "cpu"]

    def env(self, recipe_backend: str | None) -> dict[str, str | None]:
        # Any Triton kernel (port or reference) can only run here through the interpreter, which
        # must be chosen before triton is imported: hence the variable is set for every child.
        return {"TRITON_INTERPRET": "1"}

    def default_timer(self) -> str | None:
        return None


def make_backend(kind: str | None = None) -> Backend:
    facts = detect_facts(kind)
    cls = {"cuda": CudaBackend, "rocm": RocmBackend, "cpu": CpuBackend}[facts.kind]
    return cls(facts=facts)


def arch_is_amd(arch: str | None) -> bool:
    return bool(arch and re.match(r"gfx\d", arch))
