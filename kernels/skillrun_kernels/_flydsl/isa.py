"""Reading compiled AMDGPU facts: kernel metadata, ISA instruction statistics, E8M0 scale pinning.

Pure standard library so the runner and the unit tests can use it without FlyDSL.

* :func:`parse_kernel_metadata` reads ``#gpu.kernel_metadata<"name", ..., metadata = {...}>`` from a
  compiled module's text (FlyDSL ``CompiledArtifact.ir``). ``vgpr_count`` there is the *unified*
  count (ArchVGPRs up to ``.amdhsa_accum_offset`` plus AGPRs).
* :func:`functions` splits an ISA listing (``*_final_isa.s``) into per-kernel instruction lists,
  counting only instructions inside function bodies (no directives, labels or comments).
* :func:`mfma_counts` / :func:`isa_stats` count opcodes statically (a loop body counts once).
* :func:`trace_e8m0_scales` proves, with a reaching-definitions pass over the kernel's basic
  blocks, that every ``v_mfma_scale_*`` reads its two scale operands from VGPRs whose only reaching
  definition is ``v_mov_b32 vN, 0x7f7f7f7f`` (E8M0 127 = 1.0 in every byte). LLVM requires VGPR
  scale operands (inline/SGPR constants are unsafe on gfx950), so a pinned scale always shows up
  as such a move; a data-dependent scale reaches the MFMA from a load or an ALU op and fails.
"""
from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field

E8M0_ONE_X4 = 0x7F7F7F7F
METADATA_INT_FIELDS = (
    "agpr_count",
    "group_segment_fixed_size",
    "max_flat_workgroup_size",
    "private_segment_fixed_size",
    "sgpr_count",
    "sgpr_spill_count",
    "vgpr_count",
    "vgpr_spill_count",
    "wavefront_size",
)

MFMA_SCALED_RE = re.compile(r"^v_mfma_scale_f32_(16x16x128|32x32x64)_f8f6f4$")
MFMA_RE = re.compile(r"^v_(mfma|smfmac)_\w+$")

_META_HEAD = re.compile(r'#gpu\.kernel_metadata<"([^"]+)"')
_META_INT = re.compile(r"(\w+)\s*=\s*(-?\d+)\s*:\s*i\d+")


def waves_per_simd(vgpr_count: int) -> int:
    """Waves per SIMD allowed by the unified VGPR count (ArchVGPR+AGPR share 512 per lane, granule 8)."""
    if vgpr_count <= 0:
        return 8
    granules = -(-vgpr_count // 8) * 8
    return max(0, min(8, 512 // granules))


def _balanced_braces(text: str, start: int) -> str:
    """The text of ``{...}`` starting at ``text[start] == '{'`` (nested braces/angles allowed)."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    raise ValueError("unterminated metadata dictionary in #gpu.kernel_metadata")


def parse_kernel_metadata(ir_text: str) -> dict[str, dict[str, int]]:
    """``{kernel_name: {vgpr_count: .., agpr_count: .., ...}}`` from a compiled module's text."""
    out: dict[str, dict[str, int]] = {}
    for m in _META_HEAD.finditer(ir_text):
        name = m.group(1)
        at = ir_text.find("metadata = {", m.end())
        if at < 0:
            continue
        body = _balanced_braces(ir_text, at + len("metadata = "))
        fields = {k: int(v) for k, v in _META_INT.findall(body)}
        out[name] = fields
    return out


@dataclass
class Instr:
    line: int  # 1-based line number in the listing
    op: str
    operands: list[str]
    text: str


@dataclass
class Function:
    name: str
    instrs: list[Instr] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # label -> index of the next instruction
    amdhsa: dict[str, int] = field(default_factory=dict)


def _strip_comment(line: str) -> str:
    for marker in (";", "//"):
        i = line.find(marker)
        if i >= 0:
            line = line[:i]
    return line.strip()


def split_operands(rest: str) -> list[str]:
    """Comma-separated operands, keeping ``v[0:3]`` and ``op_sel:[0,1]`` intact."""
    out, depth, cur = [], 0, []
    for c in rest:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        if c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    # Trailing modifiers (``offen``, ``op_sel_hi:[..]``, ``offset:16``) follow the last operand after
    # whitespace; split them off so operand positions stay exact.
    if out:
        last = out[-1].split()
        out[-1:] = last[:1] + last[1:]
    return out


def functions(isa_text: str) -> dict[str, Function]:
    """Per-kernel instructions of an AMDGPU assembly listing."""
    funcs: dict[str, Function] = {}
    cur: Function | None = None
    declared: set[str] = set()
    amdhsa_for: Function | None = None
    for no, raw_line in enumerate(isa_text.splitlines(), 1):
        line = _strip_comment(raw_line)
        if not line:
            continue
        m = re.match(r"\.type\s+([\w.$]+)\s*,\s*@function", line)
        if m:
            declared.add(m.group(1))
            continue
        m = re.match(r"\.amdhsa_kernel\s+([\w.$]+)", line)
        if m:
            amdhsa_for = funcs.get(m.group(1))
            continue
        if line.startswith(".end_amdhsa_kernel"):
            amdhsa_for = None
            continue
        if amdhsa_for is not None:
            m = re.match(r"\.(amdhsa_\w+)\s+(-?\d+)$", line)
            if m:
                amdhsa_for.amdhsa[m.group(1)] = int(m.group(2))
            continue
        if line.endswith(":") and " " not in line:
            label = line[:-1]
            if label in declared:
                cur = funcs.setdefault(label, Function(label))
            elif label.startswith(".Lfunc_end"):
                cur = None
            elif cur is not None:
                cur.labels[label] = len(cur.instrs)
            continue
        if cur is None or line.startswith("."):
            continue
        parts = line.split(None, 1)
        op = parts[0]
        operands = split_operands(parts[1]) if len(parts) > 1 else []
        cur.instrs.append(Instr(no, op, operands, line))
    return funcs


def mfma_counts(fn: Function) -> dict[str, int]:
    c = Counter(i.op for i in fn.instrs if MFMA_RE.match(i.op))
    return dict(sorted(c.items()))


_STAT_PATTERNS = {
    "s_waitcnt": r"^s_waitcnt$",
    "s_barrier": r"^s_barrier$",
    "s_setprio": r"^s_setprio$",
    "s_nop": r"^s_nop$",
    "branches": r"^s_(c)?branch",
    "v_accvgpr_read": r"^v_accvgpr_read",
    "v_accvgpr_write": r"^v_accvgpr_write",
    "scratch_ops": r"^(scratch_|buffer_(load|store)_\w+.*)$",  # refined below
    "buffer_load": r"^buffer_load_",
    "buffer_store": r"^buffer_store_",
    "buffer_atomic": r"^buffer_atomic_",
    "s_buffer_load": r"^s_buffer_load_",
    "global_load": r"^global_load_",
    "global_store": r"^global_store_",
    "ds_read": r"^ds_(read|load)_",
    "ds_write": r"^ds_(write|store)_",
    "ds_read_b128": r"^ds_(read|load)_b128$",
    "v_fma": r"^v_(pk_)?fma_f32",
    "v_cvt": r"^v_cvt_",
}


def isa_stats(fn: Function) -> dict[str, int]:
    """Static counts of the instructions the gates and the report care about."""
    stats = {"instructions": len(fn.instrs)}
    for key, pat in _STAT_PATTERNS.items():
        if key == "scratch_ops":
            continue
        rx = re.compile(pat)
        stats[key] = sum(1 for i in fn.instrs if rx.match(i.op))
    stats["mfma"] = sum(1 for i in fn.instrs if MFMA_RE.match(i.op))
    stats["mfma_scaled"] = sum(1 for i in fn.instrs if MFMA_SCALED_RE.match(i.op))
    stats["waitcnt_vmcnt0"] = sum(1 for i in fn.instrs if i.op == "s_waitcnt" and "vmcnt(0)" in i.text)
    stats["waitcnt_lgkmcnt0"] = sum(1 for i in fn.instrs if i.op == "s_waitcnt" and "lgkmcnt(0)" in i.text)
    stats["buffer_load_lds"] = sum(1 for i in fn.instrs if i.op.startswith("buffer_load") and i.operands[-1:] == ["lds"])
    stats["buffer_load_dwordx4"] = sum(1 for i in fn.instrs if i.op == "buffer_load_dwordx4")
    # Spill traffic: flat-scratch instructions, or MUBUF accesses through the private segment.
    stats["scratch_ops"] = sum(1 for i in fn.instrs if i.op.startswith("scratch_"))
    return stats


# ---------------------------------------------------------------- E8M0 scale tracing
_VREG = re.compile(r"^v(\d+)$")
_VRANGE = re.compile(r"^v\[(\d+):(\d+)\]$")
_NO_DEF_PREFIXES = ("buffer_store", "global_store", "scratch_store", "flat_store", "ds_write", "ds_store",
                    "s_", "v_cmp", "v_cmpx", "exp", "buffer_wbl2", "buffer_inv")


def vgprs(operand: str) -> list[int]:
    m = _VREG.match(operand)
    if m:
        return [int(m.group(1))]
    m = _VRANGE.match(operand)
    if m:
        return list(range(int(m.group(1)), int(m.group(2)) + 1))
    return []


def _literal(operand: str) -> int | None:
    try:
        v = int(operand, 0)
    except ValueError:
        return None
    return v & 0xFFFFFFFF


_DS_RETURNS = ("ds_read", "ds_load", "ds_bpermute", "ds_permute", "ds_swizzle")


def _defines(ins: Instr) -> list[int]:
    """VGPRs written by ``ins`` (its destination operand), conservatively."""
    if not ins.operands or ins.op.startswith(_NO_DEF_PREFIXES):
        return []
    if ins.op.startswith("ds_") and not (ins.op.startswith(_DS_RETURNS) or "_rtn_" in ins.op):
        return []  # LDS stores/atomics without return write no VGPR
    if ins.op.startswith(("buffer_atomic", "global_atomic", "flat_atomic")):
        if not ({"glc", "sc0"} & set(ins.operands)):
            return []  # atomics return data only with glc/sc0
    return vgprs(ins.operands[0])


def _def_kind(ins: Instr, reg: int) -> str:
    if ins.op in ("v_mov_b32", "v_mov_b32_e32", "v_mov_b32_e64") and len(ins.operands) >= 2:
        if _literal(ins.operands[1]) == E8M0_ONE_X4:
            return "pinned"
    return f"line {ins.line}: {ins.text}"


def _blocks(fn: Function) -> tuple[list[tuple[int, int]], dict[int, list[int]]]:
    """Basic blocks as ``[start, end)`` instruction ranges and their successor lists."""
    leaders = {0} | set(fn.labels.values())
    for idx, ins in enumerate(fn.instrs):
        if ins.op.startswith(("s_branch", "s_cbranch", "s_setpc", "s_endpgm")):
            leaders.add(idx + 1)
    starts = sorted(i for i in leaders if i < len(fn.instrs))
    blocks = [(s, (starts[k + 1] if k + 1 < len(starts) else len(fn.instrs))) for k, s in enumerate(starts)]
    start_to_block = {s: k for k, (s, _) in enumerate(blocks)}
    succ: dict[int, list[int]] = {}
    for k, (s, e) in enumerate(blocks):
        last = fn.instrs[e - 1]
        nxt = [k + 1] if k + 1 < len(blocks) else []
        out: list[int] = []
        if last.op.startswith("s_endpgm") or last.op.startswith("s_setpc"):
            out = []
        elif last.op.startswith(("s_branch", "s_cbranch")):
            target = last.operands[0] if last.operands else ""
            tgt = fn.labels.get(target)
            if tgt is not None and tgt in start_to_block:
                out.append(start_to_block[tgt])
            if last.op.startswith("s_cbranch"):
                out += nxt
        else:
            out = nxt
        succ[k] = out
    return blocks, succ


@dataclass
class ScaleUse:
    line: int
    text: str
    operand: str
    pinned: bool
    reaching: list[str]


def trace_e8m0_scales(fn: Function) -> list[ScaleUse]:
    """For each scale operand of each ``v_mfma_scale_*``: is every reaching definition the 0x7f7f7f7f move?"""
    uses = [(idx, ins) for idx, ins in enumerate(fn.instrs) if MFMA_SCALED_RE.match(ins.op)]
    if not uses:
        return []
    blocks, succ = _blocks(fn)
    block_of = {}
    for k, (s, e) in enumerate(blocks):
        for i in range(s, e):
            block_of[i] = k
    interest: set[int] = set()
    for _, ins in uses:
        for op in ins.operands[4:6]:
            interest.update(vgprs(op))
    # Reaching definitions restricted to the registers of interest; a definition is its kind string.
    UNDEF = "undefined on entry"
    state_in: dict[int, dict[int, frozenset]] = {0: {r: frozenset([UNDEF]) for r in interest}}
    preds: dict[int, list[int]] = {k: [] for k in range(len(blocks))}
    for k, outs in succ.items():
        for t in outs:
            preds[t].append(k)

    def transfer(k: int, ins_state: dict[int, frozenset]) -> dict[int, frozenset]:
        st = dict(ins_state)
        s, e = blocks[k]
        for i in range(s, e):
            for r in _defines(fn.instrs[i]):
                if r in interest:
                    st[r] = frozenset([_def_kind(fn.instrs[i], r)])
        return st

    state_out: dict[int, dict[int, frozenset]] = {}

    def block_in(k: int) -> dict[int, frozenset]:
        inp: dict[int, frozenset] = dict(state_in[0]) if k == 0 else {}
        for p in preds[k]:
            for r, defs in state_out.get(p, {}).items():
                inp[r] = inp.get(r, frozenset()) | defs
        return inp

    work = list(range(len(blocks)))
    while work:
        k = work.pop(0)
        out = transfer(k, block_in(k))
        if state_out.get(k) != out:
            state_out[k] = out
            for t in succ[k]:
                if t not in work:
                    work.append(t)

    results: list[ScaleUse] = []
    for idx, ins in uses:
        k = block_of[idx]
        s, _ = blocks[k]
        st = block_in(k)
        for i in range(s, idx):
            for r in _defines(fn.instrs[i]):
                if r in interest:
                    st[r] = frozenset([_def_kind(fn.instrs[i], r)])
        for op in ins.operands[4:6]:
            regs = vgprs(op)
            if len(regs) != 1:
                results.append(ScaleUse(ins.line, ins.text, op, False, [f"scale operand {op!r} is not a single VGPR"]))
                continue
            defs = sorted(st.get(regs[0], frozenset([UNDEF])))
            results.append(ScaleUse(ins.line, ins.text, op, defs == ["pinned"], defs))
    return results


def e8m0_summary(fn: Function) -> dict:
    uses = trace_e8m0_scales(fn)
    bad = [u for u in uses if not u.pinned]
    return {
        "scaled_mfma": sum(1 for i in fn.instrs if MFMA_SCALED_RE.match(i.op)),
        "scale_operands": len(uses),
        "pinned": len(uses) - len(bad),
        "unpinned": len(bad),
        "first_unpinned": (
            {"line": bad[0].line, "instruction": bad[0].text, "operand": bad[0].operand, "reaching": bad[0].reaching[:3]}
            if bad
            else None
        ),
    }


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
