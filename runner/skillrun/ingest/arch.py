"""Device architecture from what a trace says about its GPUs.

Order of trust: an explicit ``arch`` argument; an exact arch the profiler recorded (AMD
``gcnArchName``, rocprof agent ``name`` = gfx950, NVIDIA compute capability); then, flagged with a
warning, an AMD product name, and as the very last resort the ISA tag inside hipBLASLt kernel
names (``…_ISA942_…``).
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Optional

from ..models import DeviceInfo

# AMD Instinct product names → gfx target (public ROCm hardware tables).
_AMD_PRODUCTS = [
    (re.compile(r"(?i)MI3[05]5X|MI350"), "gfx950"),
    (re.compile(r"(?i)MI300|MI325|MI308"), "gfx942"),
    (re.compile(r"(?i)MI2[15]0|MI210"), "gfx90a"),
    (re.compile(r"(?i)MI100"), "gfx908"),
    (re.compile(r"(?i)MI50|MI60"), "gfx906"),
]
_ISA_TAG = re.compile(r"_ISA(9[0-9][0-9a-f])(?:_|$)")
_GFX = re.compile(r"gfx[0-9]{3,4}[a-z]?")


def nvidia_arch(major: Any, minor: Any) -> Optional[str]:
    try:
        ma, mi = int(major), int(minor)
    except (TypeError, ValueError):
        return None
    if ma <= 0 or ma > 20 or mi < 0 or mi > 9:
        return None
    return f"sm_{ma}{mi}"


def clean_gfx(name: Any) -> Optional[str]:
    """``gfx942:sramecc+:xnack-`` → ``gfx942``; anything else → None."""
    if not isinstance(name, str):
        return None
    m = _GFX.search(name.lower())
    return m.group(0) if m else None


def amd_arch_from_product(name: Any) -> Optional[str]:
    if not isinstance(name, str):
        return None
    for pat, gfx in _AMD_PRODUCTS:
        if pat.search(name):
            return gfx
    return None


# HIP reports an Instinct GPU's gfx target as compute capability major.minor (gfx942 → 9.4,
# gfx950 → 9.5). 9.0 covers gfx906/908/90a, told apart by their CU counts (MI50/60: 60/64, MI100:
# 120, MI210/MI250(X) GCD: 104/110).
_AMD_COMPUTE = {(9, 4): "gfx942", (9, 5): "gfx950"}
_AMD_CU_9_0 = {60: "gfx906", 64: "gfx906", 120: "gfx908", 104: "gfx90a", 110: "gfx90a"}


def amd_arch_from_compute(major: Any, minor: Any, cus: Optional[int]) -> Optional[str]:
    ma, mi = _as_int(major), _as_int(minor)
    if ma is None or mi is None:
        return None
    if (ma, mi) == (9, 0):
        return _AMD_CU_9_0.get(cus) if cus is not None else None
    return _AMD_COMPUTE.get((ma, mi))


def arch_from_kernel_names(names: Iterable[str]) -> Optional[str]:
    """gfx target from hipBLASLt/Tensile ISA tags (``ISA942`` → gfx942); most common tag wins."""
    counts: dict[str, int] = {}
    for n in names:
        m = _ISA_TAG.search(n)
        if m:
            tag = "gfx" + m.group(1)
            counts[tag] = counts.get(tag, 0) + 1
    if not counts:
        return None
    return max(counts.items(), key=lambda kv: kv[1])[0]


# NVIDIA kernel names carry the SM generation they were built for (cuBLAS sm90_xmma_…, nvjet_sm90_…,
# CUTLASS cutlass3x_sm90_… / cutlass_80_…). A kernel built for sm_80 runs on sm_90 too, so these tags
# say "at least", where hipBLASLt's ISA tags say exactly.
_SM_TAG = re.compile(r"(?:^|[_:<])(?:sm_?|cutlass_)(\d{2,3})a?(?=_)")


def arch_tags_in_names(names: Iterable[str]) -> tuple[Optional[str], int, str]:
    """What kernel names say of the arch: (arch, names carrying it, "exact" | "at least").

    AMD ISA tags (``ISA942``) give the one target the code object runs on (the most common wins);
    NVIDIA tags the newest generation any kernel was built for (the device is at least that)."""
    isa: dict[str, int] = {}
    sm: dict[int, int] = {}
    for n in names:
        m = _ISA_TAG.search(n)
        if m:
            isa["gfx" + m.group(1)] = isa.get("gfx" + m.group(1), 0) + 1
            continue
        m = _SM_TAG.search(n)
        if m and 50 <= int(m.group(1)) <= 200:
            sm[int(m.group(1))] = sm.get(int(m.group(1)), 0) + 1
    if isa:
        tag, n = max(isa.items(), key=lambda kv: kv[1])
        return tag, n, "exact"
    if sm:
        top = max(sm)
        return f"sm_{top}", sm[top], "at least"
    return None, 0, ""


def contradicts(explicit: str, tag: Optional[str], how: str) -> bool:
    """Does ``--arch explicit`` contradict what the kernel names say?"""
    if not tag:
        return False
    if explicit.startswith("gfx") != tag.startswith("gfx"):
        return True  # another vendor altogether
    if how == "exact":
        return explicit != tag
    try:
        return int(explicit[3:]) < int(tag[3:])  # a kernel built for sm_90 cannot run on an sm_80
    except ValueError:
        return False


def _as_int(x: Any) -> Optional[int]:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str) and x.strip().isdigit():
        return int(x.strip())
    return None


def devices_from_kineto(props: Any, amd_hint: bool, warnings: list[str]) -> list[DeviceInfo]:
    """DeviceInfo per ``deviceProperties`` entry. Only hardware facts are read, nothing else."""
    out: list[DeviceInfo] = []
    if not isinstance(props, list):
        return out
    for i, p in enumerate(props):
        if not isinstance(p, dict):
            continue
        name = p.get("name") if isinstance(p.get("name"), str) else None
        warp = _as_int(p.get("warpSize"))
        gcn = clean_gfx(p.get("gcnArchName"))
        is_amd = bool(gcn) or amd_hint or (name is not None and re.search(r"(?i)\bAMD\b|Radeon|Instinct", name) is not None) \
            or warp == 64
        vendor = "amd" if is_amd else ("nvidia" if name is None or "nvidia" in name.lower() or warp == 32 else None)
        arch: Optional[str] = None
        if vendor == "amd":
            if gcn:
                arch = gcn
            else:
                arch = amd_arch_from_product(name)
                if arch:
                    warnings.append(f"arch {arch} inferred from the device name '{name}' "
                                    "(trace has no gcnArchName); pass --arch to override")
                else:
                    arch = amd_arch_from_compute(p.get("computeMajor"), p.get("computeMinor"), _as_int(p.get("numSms")))
                    if arch:
                        warnings.append(f"arch {arch} inferred from deviceProperties (HIP compute capability "
                                        f"{p.get('computeMajor')}.{p.get('computeMinor')}, warp {warp}, "
                                        f"{p.get('numSms')} CUs; no gcnArchName or product name); pass --arch to override")
        elif vendor == "nvidia":
            arch = nvidia_arch(p.get("computeMajor"), p.get("computeMinor"))
        idx = _as_int(p.get("id"))
        out.append(DeviceInfo(index=idx if idx is not None else i, name=name, vendor=vendor, arch=arch,
                              sm_count=_as_int(p.get("numSms")), warp_size=warp))
    return out


def dedupe_warnings(warnings: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for w in warnings:
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def trace_arch(devices: list[DeviceInfo], kernel_names: Iterable[str]) -> Optional[str]:
    """The arch the trace itself gives, before any ``--arch``: its devices', else the kernel names' tag."""
    traced = next((d.arch for d in devices if d.arch), None)
    if traced:
        return traced
    tag, _, how = arch_tags_in_names(kernel_names)
    return tag if how == "exact" else None


def resolve_arch(devices: list[DeviceInfo], explicit: Optional[str], kernel_names: Iterable[str],
                 warnings: list[str], vendor_hint: Optional[str] = None) -> Optional[str]:
    """The profile's arch: explicit > recorded > inferred (flagged)."""
    traced = next((d.arch for d in devices if d.arch), None)
    if explicit:
        if traced and traced != explicit:
            warnings.append(f"arch overridden: the trace says {traced}, using {explicit} as requested")
        names = list(kernel_names)
        tag, n, how = arch_tags_in_names(names)
        if contradicts(explicit, tag, how):
            warnings.append(f"--arch {explicit} contradicts the kernel names: {n} kernel name{'s carry' if n != 1 else ' carries'} "
                            f"{'the ISA tag of' if how == 'exact' else 'a tag for'} {tag}"
                            f"{'' if how == 'exact' else ' or newer'}; cards are matched for {explicit} as requested")
        return explicit
    if traced:
        return traced
    amd = vendor_hint == "amd" or any(d.vendor == "amd" for d in devices)
    if amd or vendor_hint is None:
        guess = arch_from_kernel_names(kernel_names)
        if guess:
            warnings.append(f"arch {guess} guessed from ISA tags in kernel names (the trace records no "
                            "architecture); pass --arch to be sure")
            for d in devices:
                if d.arch is None and d.vendor in (None, "amd"):
                    d.arch = guess
            return guess
    return None
