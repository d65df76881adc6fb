"""Kernel-name forms: raw (as the profiler wrote it), demangled, a bounded form for regexes, a
category, and a short display form for tables.

Profilers write names mangled (``_ZN2ck27kernel_gemm…``), demangled (``void ck::kernel_gemm…<…>``)
or truncated. Cards' regexes are searched against every form we have.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import re
import shutil
import subprocess
from functools import lru_cache
from typing import Iterable, Optional

# Regexes from cards run on names of bounded length, so a pathological pattern cannot stall a run
# on a multi-kilobyte template name (lint also rejects catastrophic patterns outright).
MAX_NAME_LEN = 4096
_MAX_DEMANGLE_INPUT = 16384  # longer "symbols" are not real mangled names; leave them as they are


# ------------------------------------------------------------------------------------ demangling
@lru_cache(maxsize=1)
def _libcxx_demangle():
    """libstdc++'s ``abi::__cxa_demangle`` through ctypes: in-process and offline (what the
    ``cxxfilt`` package wraps), so no extra dependency and no subprocess per trace."""
    for lib in (ctypes.util.find_library("stdc++"), "libstdc++.so.6", ctypes.util.find_library("c++")):
        if not lib:
            continue
        try:
            so = ctypes.CDLL(lib)
            fn = so.__cxa_demangle
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.free.argtypes = [ctypes.c_void_p]
        return fn, libc.free
    return None


def _demangle_one(name: str) -> Optional[str]:
    fns = _libcxx_demangle()
    if fns is None or len(name) > _MAX_DEMANGLE_INPUT:
        return None
    fn, free = fns
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        return None
    if b"\x00" in raw:
        return None
    status = ctypes.c_int(0)
    ptr = fn(raw, None, None, ctypes.byref(status))
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace") if status.value == 0 else None
    finally:
        free(ptr)


@lru_cache(maxsize=1)
def _cxxfilt() -> str | None:
    return shutil.which("c++filt") or shutil.which("llvm-cxxfilt") or shutil.which("llvm-cxxfilt-19")


def demangle_many(names: list[str]) -> dict[str, str]:
    """Demangle Itanium names: in-process first, then every name the in-process demangler rejected
    (an older libstdc++ does not know ``DF16b``, the bf16 type of aiter/ck_tile kernels) through
    ``c++filt``, one subprocess for all of them, each name mapped on its own. Names that are not
    mangled, or that no demangler accepts, map to themselves."""
    out = {n: n for n in names}
    mangled = [n for n in names if n.startswith("_Z")]
    if not mangled:
        return out
    left = []
    for n in mangled:
        d = _demangle_one(n[:-3] if n.endswith(".kd") else n)
        if d:
            out[n] = d
        else:
            left.append(n)
    # One name per line: a "name" with whitespace in it is not a symbol and would shift the lines.
    left = [n for n in left if len(n) <= _MAX_DEMANGLE_INPUT and not any(c.isspace() for c in n)]
    tool = _cxxfilt() if left else None
    if tool is None:
        return out
    feed = [n[:-3] if n.endswith(".kd") else n for n in left]
    try:
        res = subprocess.run([tool], input="\n".join(feed) + "\n", capture_output=True, text=True, timeout=20,
                             errors="replace")
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return out
    lines = res.stdout.splitlines()
    if res.returncode == 0 and len(lines) == len(left):
        for n, f, d in zip(left, feed, lines):
            if d and d != f:  # c++filt echoes what it cannot demangle
                out[n] = d
    return out


def name_forms(raw: str, demangled: str | None = None) -> list[str]:
    forms = [raw[:MAX_NAME_LEN]]
    if demangled and demangled != raw:
        forms.append(demangled[:MAX_NAME_LEN])
    # rocprof appends ".kd" to code-object symbols; match without it too.
    if raw.endswith(".kd"):
        forms.append(raw[:-3][:MAX_NAME_LEN])
    return forms


# ------------------------------------------------------------------------------------ categories
# First hit wins, so the order matters: a collective is "communication" even if it reduces, a
# flash-attention kernel is "attention" although it multiplies matrices.
_CATEGORY_RULES: list[tuple[str, re.Pattern[str]]] = [
    # Collectives in every spelling the libraries use: NCCL/RCCL, vLLM/SGLang custom all-reduce,
    # torch symmetric memory (``symm_mem::multimem_all_reduce_``), NVSHMEM, DeepEP, MSCCL(++), quick
    # reduce. ``all_reduce`` needs a non-letter before it so ``small_reduce`` stays a reduction.
    ("communication", re.compile(r"(?i)\b(?:void\s+)?(?:nccl|rccl)|nccl[A-Z_]|rccl|msccl|cross_device_reduce"
                                 r"|custom_?all_?reduce|(?<![a-z])all_?reduce|(?<![a-z])all_?gather|reduce_?scatter"
                                 r"|(?<![a-z])all_?to_?all|multimem|symm_?mem|symmetric_memory|nvshmem|deep_?ep"
                                 r"|quick_?reduce|one_?shot_?all|two_?shot_?all|allreduce|allgather|c10d::"
                                 r"|(?-i:AllReduce|AllGather|ReduceScatter|AllToAll)")),
    ("memcpy", re.compile(r"(?i)memcpy|memset|__amd_rocclr_(?:copy|fill)|copybuffer|fillbuffer|\bcopy_?d2d|\bmemcopy")),
    ("attention", re.compile(r"(?i)attn|attention|flash_?fwd|flash_?bwd|flash::|fmha|\bmha_|sdpa|paged_?att|mla_|unified_attention")),
    # MoE expert GEMMs and grouped GEMMs (aiter ``fmoe_bf16_…_silu``, FlyDSL ``mfma_moe1_bs_fp8``,
    # vLLM/SGLang ``fused_moe_kernel``, CK ``ck_moe_stage1``) multiply matrices, whatever activation
    # they fuse; the routing helpers (``moe_align_block_size``, ``moe_sum``, top-k) do not match here.
    ("gemm", re.compile(r"(?i)fmoe_|fused_moe|moe_?gemm|mfma_moe|moe_?[12]_|moe_stage|moe_mlp|grouped_?(?:gemm|mm)"
                        r"|group_?gemm|\bgmm_|_gmm\b")),
    ("gemm", re.compile(r"(?i)gemm|\bcijk_|nvjet|cutlass|xmma|wgmma|matmul|\bmm_|_mm\b|_mm_|cublas|hipblas|deep_gemm|tensorop"
                        r"|implicit_gemm|fprop|dgrad|wgrad|conv2d|convolution|splitk|_bmm|\bbmm")),
    ("reduction", re.compile(r"(?i)reduce|reduction|softmax|norm(?:alization)?_|layer_?norm|rms_?norm|_norm\b|topk|argmax|argmin"
                             r"|cub::|\bscan|triton_red_|triton_per_|cumsum|_sum_|sum_kernel")),
    ("elementwise", re.compile(r"(?i)elementwise|pointwise|triton_poi_|vectorized|unrolled|fill_kernel|copy_kernel|act_and_mul"
                               r"|silu|gelu|relu|rotary|rope|index_|gather|scatter|cat_?array|where_kernel|_quant|dequant|cast")),
]
_OP_CATEGORY = [
    ("gemm", re.compile(r"(?i)aten::(?:_scaled_)?(?:mm|addmm|bmm|baddbmm|linear|matmul|_grouped_mm|_scaled_grouped_mm|convolution|conv)")),
    ("attention", re.compile(r"(?i)attention|sdpa|flash")),
    ("communication", re.compile(r"(?i)c10d::|_c10d_functional|symm_mem::|nccl|all_reduce|allreduce|all_gather"
                                 r"|reduce_scatter|all_to_all|multimem")),
    ("memcpy", re.compile(r"(?i)aten::(?:copy_|to|_to_copy|zero_|fill_)\b")),
    ("reduction", re.compile(r"(?i)aten::(?:sum|mean|softmax|_softmax|layer_norm|native_layer_norm|rms_norm|max|argmax|topk|norm)\b")),
]

CATEGORIES = ("gemm", "attention", "elementwise", "reduction", "communication", "memcpy", "other")


def kernel_category(name: str, demangled: str | None = None, ops: Iterable[str] = ()) -> str:
    """One of :data:`CATEGORIES`, from the kernel's name forms, then its launching ops."""
    text = (demangled or name)[:MAX_NAME_LEN]
    if demangled and demangled != name:
        text += " " + name[:MAX_NAME_LEN]
    for cat, rx in _CATEGORY_RULES:
        if rx.search(text):
            return cat
    for op in ops:
        for cat, rx in _OP_CATEGORY:
            if rx.search(op):
                return cat
    return "other"


def is_communication(name: str, demangled: str | None = None) -> bool:
    return kernel_category(name, demangled) == "communication"


# ------------------------------------------------------------------------------------ dtypes
_DT = r"(?:bf16|fp16|f16|fp32|f32|fp8|f8|e4m3|e5m2|mxfp4|mxfp6|mxfp8|nvfp4|fp4|e2m1|int4|int8|i4|i8)"
_DT_TRIPLE = re.compile(rf"(?i)(?:^|_)({_DT})x({_DT})(?:x({_DT}))?(?=_|$)")
# Narrow formats whose mere mention in a name says what the weights (or both operands) are.
_DT_NARROW = re.compile(r"(?i)(?:^|[_\W])(mxfp4|mxfp6|mxfp8|nvfp4|e2m1|wint4|a16wi4|w4a16|w4a8|w8a8|int4|pk_i4)(?=$|[_\W])")
_DT_NORM = {"f8": "fp8", "e4m3": "fp8", "e5m2": "fp8", "f16": "fp16", "f32": "fp32", "i4": "int4", "i8": "int8",
            "e2m1": "fp4", "wint4": "int4", "pk_i4": "int4", "a16wi4": "bf16×int4", "w4a16": "bf16×int4",
            "w4a8": "fp8×int4", "w8a8": "int8"}


def dtype_from_name(name: str) -> Optional[str]:
    """The operand dtypes a kernel's name spells, where the launching op shows only its activations:
    ``_matmul_ogs_NNT_bf16xbf16xmxfp4_…`` → ``bf16×mxfp4``, ``…_mxfp8xmxfp4_…`` → ``mxfp8×mxfp4``,
    an aiter ``…_a16wi4_…`` → ``bf16×int4``. None when the name says nothing of it."""
    m = _DT_TRIPLE.search(name)
    words: list[str] = []
    if m:
        words = [w.lower() for w in m.groups() if w]
    else:
        words = [w.lower() for w in _DT_NARROW.findall(name)]
    out: list[str] = []
    for w in words:
        for part in _DT_NORM.get(w, w).split("×"):
            if part not in out:
                out.append(part)
    if not out or (len(out) == 1 and not m and out[0] in ("int8",)):
        return None
    return "×".join(out)


# ------------------------------------------------------------------------------------ display
def _strip_params(name: str) -> str:
    """``void ns::k<…>(int, float*)`` → ``ns::k<…>(…)``: the return type and the parameter list
    rarely tell kernels apart (the uniqueness pass restores them when they do)."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            c = s[i]
            if c == ")":
                depth += 1
            elif c == "(":
                depth -= 1
                if depth == 0:
                    if i > 0 and s[i - 1] not in " <,":
                        inner = s[i + 1:-1]
                        s = s[:i] + ("(…)" if inner.strip() else "()")
                    break
    return s


def _collapse_templates(s: str, keep_depth: int) -> str:
    """Elide template arguments nested deeper than ``keep_depth`` with ``…``."""
    out = []
    depth = 0
    for c in s:
        if c == "<":
            depth += 1
            if depth == keep_depth + 1:
                out.append("<…")
                continue
        elif c == ">" and depth > 0:
            depth -= 1
            if depth == keep_depth:
                out.append(">")
                continue
        if depth <= keep_depth:
            out.append(c)
    return "".join(out)


def _mid(s: str, width: int) -> str:
    if len(s) <= width:
        return s
    if width <= 1:
        return "…"
    head = (width - 1) * 3 // 5
    tail = width - 1 - head
    return s[:head] + "…" + (s[-tail:] if tail else "")


def short_name(name: str, width: int, keep: frozenset[str] = frozenset()) -> str:
    """A form of ``name`` at most ``width`` characters long: parameters dropped, then deep template
    arguments elided, then words cut out of the middle (``…``), the words in ``keep`` (those that
    tell this name from a lookalike) and the tags a reader matches on (scale recipe, dtype, arch)
    last."""
    if len(name) <= width:
        return name
    s = _strip_params(name)
    if len(s) <= width:
        return s
    for depth in (2, 1):
        c = _collapse_templates(s, depth)
        if len(c) <= width:
            return c
        s2 = c
    return _elide_words(s2, width, keep)


_WORD = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]+")
# Words a reader (and a card's regex) tells kernels apart by: scale recipe, dtype, arch/ISA, tile.
_TAG_WORD = re.compile(
    r"(?i)^(?:[ab](?:blk|vec)\d+|ovscale|blockscale|block|rowwise|tensorwise|abscale|pertoken\w*|"
    r"fp(?:4|6|8|16|32)\w*|bf16\w*|f8\w*|e4m3\w*|e5m2\w*|mxfp\d+|mxf\d+|int[48]|i4|w4a16|a8w8|a16w\w*|"
    r"isa\d+|sm_?\d+a?|gfx\d+\w*|mt\d+x\d+x\d+|moe\w*|grouped|batched|preshuffle\w*|splitk\w*|"
    r"[bhsfi]{2,3}s?|tn[nt]?|nt[nt]?|nn[nt]?|tt[nt]?)$")


def _elide_words(s: str, width: int, keep: frozenset[str] = frozenset()) -> str:
    """``s`` in at most ``width`` characters by cutting whole words out of its middle (each run of cut
    words becomes one ``…``): first the plain ones nearest the middle, then tags, never the words in
    ``keep`` while anything else can go. The first and the last word go last of all."""
    parts = _WORD.findall(s)
    words = [i for i, p in enumerate(parts) if p[0].isalnum()]
    if len(words) < 3 or "::" in s or "<" in s:
        return _mid(s, width)  # a C++ name: its structure (namespace, function, template) is kept by the caller
    first, last = words[0], words[-1]
    def prio(i: int) -> float:
        if i == first:
            return 4.0  # the family (nvjet, Cijk, triton, ck …)
        if parts[i] in keep:
            return 3.0
        if i == last and not parts[i].isdigit():
            return 2.5  # a layout or transpose tag (TNN), not a trailing count
        return 2.0 if _TAG_WORD.match(parts[i]) else 1.0

    mid = (len(words) - 1) / 2
    rank = {w: n for n, w in enumerate(words)}
    kept = set(words)

    def next_cut() -> int:
        # the least important word; among equals one that widens a gap already cut (one ``…``, not
        # many), then the one nearest the middle
        def gap_side(i: int) -> int:
            n = rank[i]
            return 0 if (n > 0 and words[n - 1] not in kept) or (n + 1 < len(words) and words[n + 1] not in kept) else 1
        return min(kept, key=lambda i: (prio(i), gap_side(i), abs(rank[i] - mid)))

    def render() -> str:
        out: list[str] = []
        gap = False
        pending = ""
        seen_word = False
        for i, p in enumerate(parts):
            if not p[0].isalnum():
                if not seen_word:
                    out.append(p)
                elif not gap:
                    pending = p
                continue
            seen_word = True
            if i in kept:
                out.append("…" if gap else pending)
                out.append(p)
                gap, pending = False, ""
            else:
                gap, pending = True, ""
        out.append("…" if gap else pending)
        return "".join(out)

    text = render()
    while len(text) > width and len(kept) > 1:
        kept.discard(next_cut())
        text = render()
    return text if len(text) <= width else _mid(text, width)


def distinguishing_words(names: list[str]) -> list[frozenset[str]]:
    """Per name, the words that tell it from its closest lookalike in ``names`` (the name sharing
    most words with it): ``…_2x1_…`` against ``…_4x1_…`` gives {2x1} and {4x1}."""
    sets = [set(w for w in _WORD.findall(n) if w[0].isalnum()) for n in names]
    out = []
    for i, ws in enumerate(sets):
        others = [o for j, o in enumerate(sets) if j != i and names[j] != names[i]]
        near = max(others, key=lambda o: len(ws & o), default=None)
        diff = ws - near if near is not None and ws & near else set()
        if len(diff) > 3:  # many words differ: the tags among them are what a reader looks for
            diff = {w for w in diff if _TAG_WORD.match(w)}
        out.append(frozenset(diff))
    return out


def _window(full: str, pos: int, width: int) -> str:
    """``full`` cut to ``width`` so that the character at ``pos`` (where it differs from a lookalike)
    stays visible, with the tail kept when there is room."""
    if len(full) <= width:
        return full
    if width < 8:
        return _mid(full, width)
    head = min(width // 3, pos)
    tail = max(0, min(width // 4, len(full) - pos - 1))
    middle = width - head - tail - (1 if head < pos else 0) - (1 if tail else 0)
    start = max(head, pos - middle // 2)
    end = min(len(full) - tail, start + middle)
    start = max(head, end - middle)
    return full[:head] + ("…" if start > head else "") + full[start:end] + ("…" if end < len(full) - tail else "") \
        + (full[len(full) - tail:] if tail else "")


def _tag(full: str) -> str:
    return "#" + hashlib.sha1(full.encode("utf-8", "replace")).hexdigest()[:6]


def display_names(names: list[str], width: int) -> list[str]:
    """Short forms of ``names`` (each at most ``width`` wide) such that different names never
    look alike: where two short forms collide, each is re-cut around its first differing
    character, and if that still collides a short hash of the full name is appended."""
    width = max(8, width)
    keep = distinguishing_words(names) if len(names) > 1 else [frozenset()] * len(names)
    shown = [short_name(n, width, k) for n, k in zip(names, keep)]
    for _ in range(2):
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(shown):
            groups.setdefault(s, []).append(i)
        clashes = [ix for ix in groups.values() if len({names[i] for i in ix}) > 1]
        if not clashes:
            return shown
        for ix in clashes:
            # Cut the parameter-less forms where they already tell the names apart, else the full ones.
            fulls = [_strip_params(names[i]) for i in ix]
            if len(set(fulls)) < len({names[i] for i in ix}):
                fulls = [names[i] for i in ix]
            for i, full in zip(ix, fulls):
                others = [o for o in fulls if o != full]
                pos = max(_common_prefix(full, o) for o in others) if others else 0
                shown[i] = _window(full, pos, width)
    # Last resort: a hash tag makes every distinct full name distinct on screen.
    groups = {}
    for i, s in enumerate(shown):
        groups.setdefault(s, []).append(i)
    for ix in groups.values():
        if len({names[i] for i in ix}) > 1:
            for i in ix:
                tag = _tag(names[i])
                shown[i] = _mid(names[i], width - len(tag)) + tag
    return shown


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
