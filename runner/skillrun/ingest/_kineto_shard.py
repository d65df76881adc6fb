"""One shard of a Kineto trace's event array: the events a process reads, kept as compact tables.

A shard holds only what ranking and linking need:

* kernels — name, duration, correlation, own ``External id``, device, graph flag (columns);
* launches — runtime/driver events by correlation: ``External id``, graph-launch flag, thread, ts;
* ops — ``cpu_op`` events by ``External id``: (name, shape-signature) key, ts, dur, thread.

Two readers fill it. :meth:`Shard.scan_chunk` is the fast path: it looks for the literal
``"cat": "kernel", "name": "`` (in the file's own spelling) with ``bytes.find``, reads the few
fields that follow by splitting a small window on quotes, and parses only the ``args`` it needs.
Events of other categories (python_function, flows, instants … most of the file) are never
touched. Whenever a chunk does not look exactly as expected, the chunk is re-read by
:meth:`Shard.add_events` from a full ``orjson`` parse, so odd layouts cost time, not correctness.

This module imports only the standard library and orjson: worker processes import it.
"""
from __future__ import annotations

import os
import re
from array import array
from typing import Any, Iterable, Optional

import orjson

CATS_KERNEL = b"kernel"
CATS_LAUNCH = (b"cuda_runtime", b"cuda_driver")
CAT_OP = b"cpu_op"
_ALL_CATS = (CATS_KERNEL,) + CATS_LAUNCH + (CAT_OP,)

# Keys that, right after '{', mark the start of a trace event (used to cut the array into chunks).
BOUNDARY = re.compile(rb'\}\s*,\s*\{\s*"(?:ph|cat|name|pid|tid|ts|dur|args|s|bp|cname|tts)"\s*:')
_PREFIX_RE = re.compile(rb'"cat"(\s*:\s*)"(?:kernel|cuda_runtime|cuda_driver|cpu_op)"(\s*,\s*)"name"(\s*:\s*)"')
_STRIP = b": ,\n\r\t{"
# HIP launch calls whose grid is the global work size (work-items), not a count of workgroups: Kineto
# copies it into the kernel event as it is, so hipBLASLt/Tensile kernels read 256x too wide.
_WORK_ITEM_LAUNCHES = frozenset({"hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel"})
_WORK_ITEM_LAUNCHES_B = frozenset(n.encode() for n in _WORK_ITEM_LAUNCHES)
_GRAPH_LAUNCH = b"GraphLaunch"
_SIG_KEYS = ("Concrete Inputs", "Input type", "Input Strides", "Input Dims")
# Profiler-step annotations (host side; "gpu_user_annotation" is the device-side copy): they bound
# the runs of identical launches that :mod:`._loops` reads as per-batch loops.
_STEP_RE = re.compile(rb'"cat"\s*:\s*"user_annotation"\s*,\s*"name"\s*:\s*"ProfilerStep#\d+"\s*,\s*"pid"\s*:\s*[^,]*,'
                      rb'\s*"tid"\s*:\s*(-?\d+)\s*,\s*"ts"\s*:\s*(-?[0-9.eE+-]+)\s*,\s*"dur"\s*:\s*(-?[0-9.eE+-]+)')


# cudaStreamBeginCapture / hipStreamEndCapture …: the launches between them build a graph, they run nothing.
_CAPTURE_RE = re.compile(rb'"cat"\s*:\s*"cuda_(?:runtime|driver)"\s*,\s*"name"\s*:\s*"(?:cuda|hip|cu)Stream(Begin|End)Capture[^"]*"'
                         rb'\s*,\s*"pid"\s*:\s*[^,]*,\s*"tid"\s*:\s*(-?\d+)\s*,\s*"ts"\s*:\s*(-?[0-9.eE+-]+)')
_CAPTURE_TOKEN = re.compile(rb'Stream(?:Begin|End)Capture')
# Whole fused-MoE layer ops (vLLM's and SGLang's ``*::outplace_fused_experts``, a workload's own
# ``*::fused_moe_*`` custom op): every kernel launched inside one belongs to that layer, whatever aten
# op launched it (the linker decides, once the op's Input Dims say it is a MoE layer). Routing
# helpers (moe_align_block_size, moe_sum, moe_sorting) are not layers.
LAYER_OP = re.compile(r"(?i)fused_moe|fused_experts")
_LAYER_TOKENS = (b"fused_moe", b"fused_experts", b"FUSED_MOE", b"FUSED_EXPERTS")


_RX_CACHE: dict = {}


def _regex(prefixes: dict[bytes, bytes]) -> re.Pattern:
    """One regex for every event the fast path reads, starting with the file's literal spelling
    of ``"cat": "`` so that sre's literal-prefix search skips most of the bytes.

    Kernels are not in it: their names are long (templates) and sre walks a character class
    slowly, so :meth:`Shard._scan_kernels` finds them with ``bytes.find`` instead.
    Alternatives (named groups): cpu_op (ox), runtime/driver launch
    (ln, lt, ls, lx, lc); a last alternative (bad) matches any of those categories whose layout
    the others did not recognize, which sends the chunk to the full parser.
    """
    key = prefixes[CATS_KERNEL]
    rx = _RX_CACHE.get(key)
    if rx is not None:
        return rx
    k = prefixes[CATS_KERNEL]
    head = k[:k.index(b'"kernel"') + 1]  # '"cat": "'
    mid = k[k.index(b'"kernel"') + len(b'"kernel'):]  # '", "name": "'
    e = re.escape
    fields = (rb'\s*,\s*"pid"\s*:\s*-?\d+\s*,\s*"tid"\s*:\s*(?P<%s>-?\d+)\s*,\s*"ts"\s*:\s*(?P<%s>-?[0-9.eE+-]+)'
              rb'\s*,\s*"dur"\s*:\s*[-0-9.eE+]+\s*,\s*"args"\s*:\s*\{\s*')
    rx = re.compile(
        e(head) + rb"(?:"
        + rb"cpu_op" + e(mid) + rb'[^{"\\]*"\s*,[^{]*\{\s*"External id"\s*:\s*(?P<ox>\d+)'
        + rb"|cuda_(?:runtime|driver)" + e(mid) + rb'(?P<ln>[^"\\]*)"'
        + (fields % (b"lt", b"ls"))
        + rb'(?:"External id"\s*:\s*(?P<lx>\d+)\s*,\s*)?'
        # other args before the correlation: numbers, short arrays, strings (ROCm puts the whole
        # kernel name in a "kernel" arg, braces and all)
        rb'(?:"[^"\\]*"\s*:\s*(?:"[^"\\]*(?:\\.[^"\\]*)*"|\[[^\]\[{}]*\]|[^,{}\[\]"]*)\s*,\s*)*?'
        rb'"correlation"\s*:\s*(?P<lc>\d+)'
        + rb'|(?P<bad>cpu_op|cuda_runtime|cuda_driver)"'
        + rb")")
    _RX_CACHE[key] = rx
    return rx


def _op_head(prefix: bytes) -> re.Pattern:
    rx = _RX_CACHE.get(("op", prefix))
    if rx is None:
        rx = _RX_CACHE[("op", prefix)] = re.compile(
            re.escape(prefix) + rb'([^"\\]*)"\s*,\s*"pid"\s*:\s*[^,]*,\s*"tid"\s*:\s*(-?\d+)\s*,\s*"ts"\s*:\s*'
            rb'(-?[0-9.eE+-]+)\s*,\s*"dur"\s*:\s*(-?[0-9.eE+-]+)\s*,\s*"args"\s*:\s*\{\s*"External id"\s*:\s*(\d+)')
    return rx


# What follows a kernel's name, up to the opening brace of its args.
_KTAIL = re.compile(rb'"\s*,\s*"pid"\s*:\s*[^,]*,\s*"tid"\s*:\s*[^,]*,\s*"ts"\s*:\s*([-0-9.eE+]+)\s*,\s*'
                    rb'"dur"\s*:\s*(-?[0-9.eE+-]+)\s*,\s*"args"\s*:\s*\{')


class ChunkMismatch(Exception):
    """The chunk does not have the layout the fast path expects."""


def detect_prefixes(sample: bytes) -> Optional[dict[bytes, bytes]]:
    """The exact bytes between ``"cat"`` and the start of the kernel name, per category.

    Writers are consistent within a file (Kineto: ``"cat": "kernel", "name": "``; json.dump with
    indent puts a newline and spaces before ``"name"``), so the spelling seen on the first event
    is used for all categories. None when no event in the sample has cat followed by name.
    """
    m = _PREFIX_RE.search(sample)
    if not m:
        return None
    a, b, c = m.group(1), m.group(2), m.group(3)
    return {cat: b'"cat"' + a + b'"' + cat + b'"' + b + b'"name"' + c + b'"' for cat in _ALL_CATS}


def _num(x: Any) -> Optional[float]:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x) if x == x else None
    if isinstance(x, str):
        try:
            v = float(x)
        except ValueError:
            return None
        return v if v == v else None
    return None


def _int(x: Any) -> int:
    """Non-negative integer ids; -1 when absent or odd."""
    if isinstance(x, bool):
        return -1
    if isinstance(x, int):
        return x if x >= 0 else -1
    if isinstance(x, float) and x.is_integer() and x >= 0:
        return int(x)
    if isinstance(x, str) and x.isdigit():
        return int(x)
    return -1


def _tid(x: Any) -> Any:
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str) and x.strip().lstrip("-").isdigit():
        return int(x.strip())
    return str(x)


class Shard:
    def __init__(self) -> None:
        self.name_ids: dict[Any, int] = {}  # raw name (bytes from the fast path, str otherwise) → id
        self.names: list[str] = []
        self.kname: list[int] = []
        self.kdur: list[float] = []
        self.kts: list[float] = []  # start, µs (NaN when the event has none): busy/idle time per device
        self.kcorr: list[int] = []
        self.kext: list[int] = []
        self.kdev: list[int] = []
        self.kgraph: list[int] = []
        self.kgrid: dict[int, dict] = {}  # name id → {(grid, block): calls}
        self.klaunch: dict[int, dict] = {}  # name id → launch facts of its first call (registers, shared memory)
        self.launches: dict[int, tuple] = {}  # corr → (ext, is_graph, tid, ts, grid_in_work_items)
        self.graph_launches = 0
        self.hip = False  # hip* launch APIs seen (ROCm build of torch)
        self.cuda = False
        self.ops: dict[int, tuple] = {}  # ext → (opkey id, ts, dur, tid)
        self.opkey_ids: dict[tuple, int] = {}
        self.opkeys: list[tuple] = []  # id → (name str, sig bytes, has_dims)
        self.op_pos: dict[int, int] = {}  # ext → file offset of a not-yet-parsed cpu_op
        self.path: Optional[str] = None
        self.prefixes: Optional[dict] = None
        self.fast_chunks = 0
        self.slow_chunks = 0
        self.events_bad = 0
        self._nest: Optional[dict] = None
        self.steps: list[tuple] = []  # ProfilerStep annotations: (tid, start, end)
        self.layers: list[tuple] = []  # fused-MoE layer ops (LAYER_OP): (tid, start, end, External id)
        self.capture_marks: list[tuple] = []  # (tid, ts, is_begin) of stream-capture begin/end calls
        # thread and time of every kernel-launch call (…Launch…), to count those inside a capture
        self.launch_tid = array("q")
        self.launch_ts = array("d")

    # ------------------------------------------------------------------ shared helpers
    def _name_id(self, raw: Any) -> int:
        nid = self.name_ids.get(raw)
        if nid is None:
            if isinstance(raw, bytes):
                name = raw.decode("utf-8", "replace") if b"\\" not in raw else _unescape(raw)
            else:
                name = raw
            nid = self.name_ids[raw] = len(self.names)
            self.names.append(name)
        return nid

    def _opkey(self, name: Any, sig: bytes) -> int:
        key = (name, sig)
        oid = self.opkey_ids.get(key)
        if oid is None:
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace") if b"\\" not in name else _unescape(name)
            oid = self.opkey_ids[key] = len(self.opkeys)
            self.opkeys.append((name, sig, b'"Input Dims"' in sig))
        return oid

    def _kernel(self, nid: int, dur: float, args: dict, ts: Optional[float] = None) -> None:
        self.kname.append(nid)
        self.kdur.append(dur)
        self.kts.append(ts if ts is not None else float("nan"))
        self.kcorr.append(_int(args.get("correlation")))
        self.kext.append(_int(args.get("External id")))
        dev = _int(args.get("device"))
        self.kdev.append(dev)
        g = args.get("graph id")
        self.kgraph.append(1 if (g is not None and g != 0 and g != -1) else 0)
        self._count_grid(nid, args.get("grid"), args.get("block"))
        if nid not in self.klaunch:
            self._note_launch(nid, args)

    def _note_launch(self, nid: int, args: dict) -> None:
        """CUPTI's per-kernel launch facts, from the first call of each kernel."""
        facts = {}
        for key, out in (("registers per thread", "registers_per_thread"), ("shared memory", "shared_mem_bytes")):
            v = args.get(key)
            if type(v) is int and v >= 0:
                facts[out] = v
        self.klaunch[nid] = facts

    def _count_grid(self, nid: int, grid: Any, block: Any) -> None:
        # Launch geometry differs per call (shape); the profile reports the most common one.
        key = (tuple(grid) if isinstance(grid, list) else None, tuple(block) if isinstance(block, list) else None)
        c = self.kgrid.get(nid)
        if c is None:
            self.kgrid[nid] = {key: 1}
        else:
            c[key] = c.get(key, 0) + 1

    def _launch(self, name: Any, tid: Any, ts: float, args: dict) -> None:
        corr = _int(args.get("correlation"))
        if corr < 0:
            return
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        graph = "GraphLaunch" in name
        if name.startswith("hip"):
            self.hip = True
        elif name.startswith("cu"):
            self.cuda = True
        if graph:
            self.graph_launches += 1
        if "Launch" in name:
            self.launch_tid.append(tid if isinstance(tid, int) else -1)
            self.launch_ts.append(ts)
        self.launches[corr] = (_int(args.get("External id")), graph, tid, ts, name in _WORK_ITEM_LAUNCHES)

    # ------------------------------------------------------------------ slow path: parsed events
    def add_events(self, events: Iterable[Any]) -> None:
        """Fill the tables from already-parsed event dicts (small files and fallback chunks)."""
        for ev in events:
            if not isinstance(ev, dict):
                continue
            cat = ev.get("cat")
            if cat == "user_annotation":
                self._step(ev)
                continue
            if cat not in ("kernel", "cuda_runtime", "cuda_driver", "cpu_op"):
                continue
            if ev.get("ph", "X") != "X":
                continue
            name = ev.get("name")
            if not isinstance(name, str):
                name = "" if name is None else str(name)
            args = ev.get("args")
            if not isinstance(args, dict):
                args = {}
            ts = _num(ev.get("ts"))
            dur = _num(ev.get("dur"))
            if cat == "kernel":
                if dur is None:
                    self.events_bad += 1
                    continue
                self._kernel(self._name_id(name), dur, args, ts)
            elif cat == "cpu_op":
                ext = _int(args.get("External id"))
                if ext < 0 or ts is None:
                    continue
                sub = {k: args[k] for k in _SIG_KEYS if k in args}
                sig = orjson.dumps(sub)[1:-1] if sub else b""
                self.ops[ext] = (self._opkey(name, sig), ts, dur or 0.0, _tid(ev.get("tid")))
                if LAYER_OP.search(name):
                    self.layers.append((_tid(ev.get("tid")), ts, ts + (dur or 0.0), ext))
            else:
                if "Capture" in name and ("BeginCapture" in name or "EndCapture" in name) and ts is not None:
                    self.capture_marks.append((_tid(ev.get("tid")), ts, "BeginCapture" in name))
                self._launch(name, _tid(ev.get("tid")), ts if ts is not None else -1.0, args)

    def _step(self, ev: dict) -> None:
        name = ev.get("name")
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
        if isinstance(name, str) and name.startswith("ProfilerStep#") and ts is not None and dur is not None:
            self.steps.append((_tid(ev.get("tid")), ts, ts + dur))

    def _scan_captures(self, buf: bytes) -> None:
        if b"Capture" not in buf:
            return
        found = [(int(m.group(2)), float(m.group(3)), m.group(1) == b"Begin") for m in _CAPTURE_RE.finditer(buf)]
        if len(found) != len(_CAPTURE_TOKEN.findall(buf)):
            raise ChunkMismatch("capture event layout")  # the slow path reads them field by field
        self.capture_marks.extend(found)

    def captured_launches(self) -> int:
        """Launches recorded between a stream-capture begin and end on the same thread (windows
        whose two ends fall in this shard)."""
        by_tid: dict = {}
        for tid, ts, begin in sorted(self.capture_marks, key=lambda m: m[1]):
            w = by_tid.setdefault(tid, [])
            if begin:
                w.append([ts, None])
            elif w and w[-1][1] is None:
                w[-1][1] = ts
        windows = {tid: [(a, b) for a, b in w if b is not None] for tid, w in by_tid.items()}
        if not any(windows.values()):
            return 0
        n = 0
        for tid, ts in zip(self.launch_tid, self.launch_ts):
            for a, b in windows.get(tid, ()):
                if a <= ts <= b:
                    n += 1
                    break
        return n

    def _scan_layers(self, buf: bytes, prefix: bytes) -> None:
        """Fused-MoE layer ops of a chunk (LAYER_OP), read only when their name occurs in it (a
        Triton ``fused_moe_kernel`` name brings a harmless extra pass over the chunk's op heads)."""
        if not any(tok in buf for tok in _LAYER_TOKENS):
            return
        found = []
        for m in _op_head(prefix).finditer(buf):
            name = m.group(1).decode("utf-8", "replace")
            if LAYER_OP.search(name):
                try:
                    ts, dur = float(m.group(3)), float(m.group(4))
                except ValueError:  # an odd number: that layer is not attributed, the rest of the chunk stands
                    continue
                found.append((int(m.group(2)), ts, ts + max(dur, 0.0), int(m.group(5))))
        self.layers.extend(found)

    def _scan_steps(self, buf: bytes) -> None:
        if b"ProfilerStep#" not in buf:
            return
        for m in _STEP_RE.finditer(buf):
            ts, dur = float(m.group(2)), float(m.group(3))
            self.steps.append((int(m.group(1)), ts, ts + dur))

    # ------------------------------------------------------------------ fast path: raw bytes
    def scan_chunk(self, buf: bytes, prefixes: dict[bytes, bytes], base: int = -1) -> None:
        """Read one chunk of whole events; ``base`` is its file offset (-1: not a file).

        With a file offset, ``cpu_op`` events are only indexed (External id → offset) and
        parsed later, and only if a kernel links to them: most ops never launch a kernel.
        Falls back to a full parse of the chunk on any surprise.
        """
        mark = (len(self.kname), self.graph_launches, len(self.names), len(self.opkeys), self.hip, self.cuda,
                len(self.launch_ts))
        try:
            self._scan_fast(buf, _regex(prefixes), base, prefixes[CATS_KERNEL])
            if base < 0:
                self._scan_ops(buf, prefixes[CAT_OP])
            self._scan_captures(buf)  # before the steps: it may still send the chunk to the slow path
            self._scan_steps(buf)
            self._scan_layers(buf, prefixes[CAT_OP])  # last: nothing after it can send the chunk back
            self.fast_chunks += 1
        except (ChunkMismatch, ValueError, IndexError, orjson.JSONDecodeError):
            self._rollback(mark)
            self.slow_chunks += 1
            try:
                events = orjson.loads(b"[" + buf + b"]")
            except orjson.JSONDecodeError as exc:
                raise ValueError(f"invalid JSON in the event list ({exc})") from None
            self.add_events(events)

    def _scan_fast(self, buf: bytes, rx: re.Pattern, base: int, kprefix: bytes) -> None:
        launches = self.launches
        pos = self.op_pos
        graphs = 0
        # Group numbers of _regex: 1 = op External id, 2-6 = launch (name, tid, ts, ext, corr), 7 = bad.
        for m in rx.finditer(buf):
            li = m.lastindex
            if li == 1:
                if base >= 0:
                    pos[int(m.group(1))] = base + m.start()
            elif li == 6:
                name, tid, ts, ext, corr = m.group(2, 3, 4, 5, 6)
                graph = _GRAPH_LAUNCH in name
                graphs += graph
                launches[int(corr)] = (int(ext) if ext else -1, graph, int(tid), float(ts), name in _WORK_ITEM_LAUNCHES_B)
                if b"Launch" in name:
                    self.launch_tid.append(int(tid))
                    self.launch_ts.append(float(ts))
            else:
                raise ChunkMismatch("unrecognized event layout")
        self.graph_launches += graphs
        if not (self.hip or self.cuda):
            self.hip = b'"hipLaunch' in buf or b'"hipModuleLaunch' in buf or b'"hipExtModuleLaunch' in buf
            self.cuda = not self.hip and (b'"cudaLaunch' in buf or b'"cuLaunch' in buf)
        n_kernels = self._scan_kernels(buf, kprefix)
        # Guard against kernel events spelled differently from the detected prefix.
        tokens = buf.count(b'"kernel"')
        if n_kernels != tokens and n_kernels != tokens - buf.count(b'"kernel":'):  # ROCm: a "kernel" arg key
            raise ChunkMismatch("kernel count")

    def _scan_kernels(self, buf: bytes, prefix: bytes) -> int:
        find = buf.find
        match = _KTAIL.match
        loads = orjson.loads
        name_ids = self.name_ids
        kname, kdur, kcorr, kext, kdev, kgraph, kts = (self.kname, self.kdur, self.kcorr, self.kext, self.kdev,
                                                       self.kgraph, self.kts)
        lp = len(prefix)
        n = 0
        i = find(prefix)
        while i >= 0:
            j = i + lp
            q = find(b'"', j)
            if q < 0 or buf[q - 1] == 92:  # no end, or an escaped quote inside the name
                raise ChunkMismatch("kernel name")
            m = match(buf, q)
            if m is None:
                raise ChunkMismatch("kernel layout")
            a0 = m.end() - 1
            a1 = find(b"}", a0)
            a = loads(buf[a0:a1 + 1])
            name = buf[j:q]
            nid = name_ids.get(name)
            if nid is None:
                nid = self._name_id(name)
            kname.append(nid)
            kdur.append(float(m.group(2)))
            kts.append(float(m.group(1)))
            c = a.get("correlation")
            kcorr.append(c if type(c) is int and c >= 0 else -1)
            x = a.get("External id")
            kext.append(x if type(x) is int and x >= 0 else -1)
            d = a.get("device")
            kdev.append(d if type(d) is int and d >= 0 else -1)
            gi = a.get("graph id")
            kgraph.append(1 if (gi is not None and gi != 0 and gi != -1) else 0)
            self._count_grid(nid, a.get("grid"), a.get("block"))
            if nid not in self.klaunch:
                self._note_launch(nid, a)
            n += 1
            i = find(prefix, a1)
        return n

    def _rollback(self, mark: tuple) -> None:
        nk, ng, nn, nok, hip, cuda, nl = mark
        del self.launch_tid[nl:]
        del self.launch_ts[nl:]
        for col in (self.kname, self.kdur, self.kts, self.kcorr, self.kext, self.kdev, self.kgraph):
            del col[nk:]
        # Launch/op entries are keyed by unique ids: re-reading the chunk overwrites them with
        # the same facts. Only counters and id tables need undoing.
        self.graph_launches, self.hip, self.cuda = ng, hip, cuda
        for raw in [r for r, i in self.name_ids.items() if i >= nn]:
            del self.name_ids[raw]
        del self.names[nn:]
        for k in [k for k in self.kgrid if k >= nn]:
            del self.kgrid[k]
        for k in [k for k in self.klaunch if k >= nn]:
            del self.klaunch[k]
        for key in [k for k, i in self.opkey_ids.items() if i >= nok]:
            del self.opkey_ids[key]
        del self.opkeys[nok:]
        for ext in [e for e, v in self.ops.items() if v[0] >= nok]:
            del self.ops[ext]

    @staticmethod
    def _fields(buf: bytes, start: int, first: int = 2048) -> list:
        """Split the event text after the name's opening quote into its leading fields."""
        for width in (first, 1 << 16, 1 << 22):
            s = buf[start:start + width].split(b'"', 12)
            if len(s) == 13 and b"}" in s[12]:
                return s
            if start + width >= len(buf):
                break
        raise ChunkMismatch("event longer than expected")

    @staticmethod
    def _check(s: list) -> None:
        if not (s[2] == b"pid" and s[4] == b"tid" and s[6] == b"ts" and s[8] == b"dur" and s[10] == b"args"
                and s[11].rstrip().endswith(b"{") and not s[0].endswith(b"\\")):
            raise ChunkMismatch("field layout")

    def _parse_op(self, buf: bytes, i: int, prefix: bytes) -> Optional[tuple]:
        """(ext, opkey id, ts, dur, tid) for the cpu_op whose prefix starts at ``i``."""
        s = self._fields(buf, i + len(prefix), 2048)
        self._check(s)
        rest = s[12]
        e = rest.find(b"}")
        if not rest.startswith(b'External id"'):
            args = orjson.loads(b'{"' + rest[:e + 1])
            ext = _int(args.get("External id"))
            if ext < 0:
                return None
            sub = {k: args[k] for k in _SIG_KEYS if k in args}
            sig = orjson.dumps(sub)[1:-1] if sub else b""
        else:
            c = rest.find(b",", 13, e)
            ext = int(rest[rest.index(b":") + 1:c if c >= 0 else e])
            a = rest.find(b'"Concrete Inputs"', 0, e)
            b = rest.find(b'"Input', 0, e)
            k = a if (a >= 0 and (b < 0 or a < b)) else b
            if k >= 0:
                z = rest.find(b'"Ev Idx"', k, e)
                sig = rest[k:z if z >= 0 else e].rstrip(b", \n\r\t")
            else:
                sig = b""
        key = (s[0], sig)
        oid = self.opkey_ids.get(key)
        if oid is None:
            oid = self._opkey(s[0], sig)
        return ext, oid, float(s[7].strip(_STRIP)), float(s[9].strip(_STRIP)), int(s[5].strip(_STRIP))

    def _parse_op_fast(self, buf: bytes, i: int, prefix: bytes, head: re.Pattern) -> Optional[tuple]:
        """Kineto's usual op layout (External id first in args); None when it is something else."""
        m = head.match(buf, i)
        if m is None:
            return None
        name, tid, ts, dur, ext = m.groups()
        a0 = m.end()
        e = buf.find(b"}", a0)
        if e < 0:
            return None
        a = buf.find(b'"Concrete Inputs"', a0, e)
        b = buf.find(b'"Input', a0, e)
        k = a if (a >= 0 and (b < 0 or a < b)) else b
        if k >= 0:
            z = buf.find(b'"Ev Idx"', k, e)
            sig = buf[k:z if z >= 0 else e].rstrip(b", \n\r\t")
        else:
            sig = b""
        key = (name, sig)
        oid = self.opkey_ids.get(key)
        if oid is None:
            oid = self._opkey(name, sig)
        return int(ext), oid, float(ts), float(dur), int(tid)

    def _scan_ops(self, buf: bytes, prefix: bytes) -> None:
        """Eager op reading (no file behind the chunk)."""
        find = buf.find
        lp = len(prefix)
        i = find(prefix)
        while i >= 0:
            r = self._parse_op(buf, i, prefix)
            if r is not None:
                self.ops[r[0]] = r[1:]
            i = find(prefix, i + lp)

    def _load_ops(self, exts: Iterable[int]) -> None:
        """Parse indexed ops (by file offset) into ``self.ops``."""
        todo = [(self.op_pos[x], x) for x in exts if x not in self.ops and x in self.op_pos]
        found, _ = self.parse_ops_at(todo)
        self.ops.update(found)

    # ------------------------------------------------------------------ queries from the linker
    def kernel_table(self) -> dict:
        """Kernel columns plus each kernel's launch when it is in this shard (else None)."""
        get = self.launches.get
        launch = [get(c) if c >= 0 else None for c in self.kcorr]
        # Numeric columns travel as arrays: pickling them is a copy, not one object per value.
        return {"names": self.names, "kname": array("q", self.kname), "kdur": array("d", self.kdur), "kts": array("d", self.kts),
                "kcorr": array("q", self.kcorr), "kext": array("q", self.kext), "kdev": array("q", self.kdev),
                "kgraph": array("b", self.kgraph), "launch": launch,
                "kgrid": self.kgrid, "klaunch": self.klaunch, "graph_launches": self.graph_launches, "hip": self.hip, "cuda": self.cuda,
                "fast_chunks": self.fast_chunks, "slow_chunks": self.slow_chunks, "events_bad": self.events_bad,
                "steps": self.steps, "layers": self.layers, "captures": sum(1 for m in self.capture_marks if m[2]),
                "captured_launches": self.captured_launches()}

    def lookup_launches(self, corrs: Iterable[int]) -> dict[int, tuple]:
        get = self.launches.get
        out = {}
        for c in corrs:
            v = get(c)
            if v is not None:
                out[c] = v
        return out

    def lookup_ops(self, exts: Iterable[int]) -> tuple[dict[int, tuple], dict[int, tuple]]:
        """Ops for ``exts`` held by this shard: ``ext → (opkey id, ts, dur, tid)`` and the opkeys
        they use (``id → (name, sig, has_dims)``). Ops only indexed by offset are parsed now."""
        get = self.ops.get
        pos = self.op_pos.get
        found = {}
        todo = []
        for x in exts:
            v = get(x)
            if v is not None:
                found[x] = v
            else:
                o = pos(x)
                if o is not None:
                    todo.append((o, x))
        if todo:
            parsed, _ = self.parse_ops_at(todo)
            found.update(parsed)
        used = {oid: self.opkeys[oid] for oid in {v[0] for v in found.values()}}
        return found, used

    def parse_ops_at(self, todo: list[tuple[int, int]]) -> tuple[dict[int, tuple], dict[int, tuple]]:
        """Parse the cpu_ops at these (file offset, ext) pairs — any worker can, the file is shared."""
        out = {}
        used: dict[int, tuple] = {}
        if self.path is None or not todo:
            return out, used
        prefix = self.prefixes[CAT_OP]
        head = _op_head(prefix)
        block = b""
        blk = 0
        with open(self.path, "rb") as fh:
            for off, x in sorted(todo):
                r = None
                for width in (4096, 1 << 16, 1 << 22):
                    if off < blk or off + width > blk + len(block):
                        fh.seek(off)
                        block = fh.read(max(width, 1 << 20))
                        blk = off
                    try:
                        r = self._parse_op_fast(block, off - blk, prefix, head)
                        if r is None:
                            r = self._parse_op(block, off - blk, prefix)
                        break
                    except (ChunkMismatch, ValueError, IndexError, orjson.JSONDecodeError):
                        r = None
                        if blk + len(block) < off + width:
                            break  # end of file: the op really is malformed
                if r is not None:
                    out[r[0]] = r[1:]
                    if r[1] not in used:
                        used[r[1]] = self.opkeys[r[1]]
        return out, used

    def nest(self, queries: list[tuple]) -> tuple[list[tuple], dict[int, tuple]]:
        """For each (tid, ts): innermost enclosing op and innermost one with Input Dims, if any.

        Returns per query ``(any_opkey, any_start, dims_opkey, dims_start)`` (-1 = none) and the
        opkeys those ops use.
        """
        if self._nest is None:
            self._load_ops(list(self.op_pos))  # nesting needs every op's interval: parse them all
            by_tid: dict[Any, list] = {}
            for ext, (oid, ts, dur, tid) in self.ops.items():
                by_tid.setdefault(tid, []).append((ts, -(dur or 0.0), ts + (dur or 0.0), ext, oid))
            for lst in by_tid.values():
                lst.sort()
            self._nest = by_tid
        order = sorted(range(len(queries)), key=lambda q: (str(queries[q][0]), queries[q][1]))
        res: list[tuple] = [(-1, 0.0, -1, 0.0)] * len(queries)
        eps = 1.0
        cur_tid = object()
        stack: list[tuple] = []
        pos = 0
        ops_list: list = []
        for q in order:
            tid, t = queries[q]
            if tid != cur_tid:
                cur_tid = tid
                ops_list = self._nest.get(tid, [])
                stack = []
                pos = 0
            while pos < len(ops_list) and ops_list[pos][0] <= t + eps:
                o = ops_list[pos]
                while stack and stack[-1][2] < o[0]:
                    stack.pop()
                stack.append(o)
                pos += 1
            while stack and stack[-1][2] + eps < t:
                stack.pop()
            any_op = None
            dims_op = None
            for o in reversed(stack):
                if o[2] + eps < t or o[0] > t + eps:
                    continue
                if any_op is None:
                    any_op = o
                if self.opkeys[o[4]][2]:
                    dims_op = o
                    break
            res[q] = (any_op[4] if any_op else -1, any_op[0] if any_op else 0.0,
                      dims_op[4] if dims_op else -1, dims_op[0] if dims_op else 0.0)
        used = {}
        for a, _, d, _ in res:
            for oid in (a, d):
                if oid >= 0:
                    used[oid] = self.opkeys[oid]
        return res, used


def _unescape(raw: bytes) -> str:
    try:
        v = orjson.loads(b'"' + raw + b'"')
        return v if isinstance(v, str) else raw.decode("utf-8", "replace")
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


# ---------------------------------------------------------------------- whole ranges and the array end
READ_SIZE = 16 << 20
TAIL_MARGIN = 8 << 20  # the last bytes of the array are parsed event by event (robust to any tail)
MAX_CARRY = 256 << 20


class NoBoundary(Exception):
    """No event boundary in a large stretch of bytes: this file cannot be split into chunks."""


def _last_cut(buf: bytes, keep: int) -> int:
    """Offset just after the last event that ends before ``len(buf) - keep`` (0 when none)."""
    lo = max(0, len(buf) - keep - (1 << 20))
    best = 0
    for m in BOUNDARY.finditer(buf, lo, max(lo, len(buf) - keep)):
        best = m.start() + 1
    if best == 0 and lo > 0:
        m = None
        for m in BOUNDARY.finditer(buf, 0, len(buf) - keep):
            pass
        if m is not None:
            best = m.start() + 1
    return best


def finish_array(shard: "Shard", data: bytes) -> dict:
    """Parse ``data`` = the last events, the closing ``]`` and the rest of the document.

    Returns the top-level keys after the event list (only ``deviceProperties`` is kept).
    """
    import json

    from ._jsonhead import BadJSON, parse_tail

    text = data.decode("utf-8", "replace")
    dec = json.JSONDecoder()
    n = len(text)
    i = 0
    events = []
    ws = " \t\r\n"
    while i < n and text[i] in ws:
        i += 1
    if i < n and text[i] == ",":
        i += 1
    while True:
        while i < n and text[i] in ws:
            i += 1
        if i >= n:
            raise BadJSON("file ends inside the event list (truncated?)", i)
        if text[i] == "]":
            break
        try:
            ev, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise BadJSON(f"invalid JSON in the event list ({exc.msg})", exc.pos) from None
        events.append(ev)
        while i < n and text[i] in ws:
            i += 1
        if i < n and text[i] == ",":
            i += 1
        elif i < n and text[i] != "]":
            raise BadJSON("expected ',' or ']' between events", i)
        if len(events) >= 20000:
            shard.add_events(events)
            events = []
    shard.add_events(events)
    tail = parse_tail(text[i + 1:])
    return {"deviceProperties": tail["deviceProperties"]} if "deviceProperties" in tail else {}


def scan_stream(shard: "Shard", read, prefixes: Optional[dict], is_last: bool, report=None,
                base: int = -1) -> dict:
    """Scan a stream of whole events (``read(n)`` → bytes) into ``shard``.

    ``base`` is the file offset of the stream's first byte (-1 when it is not a plain file).
    With ``is_last`` the stream runs to the end of the document and the array end and what
    follows are checked; otherwise it must end exactly after an event.
    """
    carry = b""
    off = base  # file offset of carry[0]
    eof = False
    tail: dict = {}
    while not eof:
        data = read(READ_SIZE)
        if not data:
            eof = True
        buf = carry + data if carry else data
        if report and data:
            report(len(data))
        if not eof:
            keep = TAIL_MARGIN if is_last else 0
            cut = _last_cut(buf, keep)
            if cut == 0:
                if len(buf) > MAX_CARRY:
                    raise NoBoundary()
                carry = buf
                continue
            _scan(shard, buf[:cut], prefixes, off)
            nxt = buf.find(b"{", cut, cut + 4096)
            nxt = nxt if nxt >= 0 else cut
            carry = buf[nxt:]
            if off >= 0:
                off += nxt
            continue
        if is_last:
            tail = finish_array(shard, buf)
        elif buf.strip():
            _scan(shard, buf, prefixes, off)
    return tail


def _scan(shard: "Shard", chunk: bytes, prefixes: Optional[dict], base: int = -1) -> None:
    lead = len(chunk) - len(chunk.lstrip())
    chunk = chunk.strip()
    if base >= 0:
        base += lead
    if chunk.startswith(b","):
        chunk = chunk[1:].lstrip()
        base = -1  # offsets no longer needed for correctness; fall back to eager op reading
    chunk = chunk.rstrip(b", \n\r\t")
    if not chunk:
        return
    if prefixes is None:
        shard.slow_chunks += 1
        try:
            events = orjson.loads(b"[" + chunk + b"]")
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON in the event list ({exc})") from None
        shard.add_events(events)
    else:
        shard.scan_chunk(chunk, prefixes, base)


def serve(conn, shard: "Shard", first: dict) -> None:
    """Answer the linker's questions about this shard until told to stop."""
    conn.send(("done", first))
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        name, args = req
        if name == "close":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", getattr(shard, name)(*args)))
        except Exception as exc:  # report, never hang the parent
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def worker_range(conn, path: str, prefixes: Optional[dict]) -> None:
    """Child process: scan the byte ranges the parent hands out, then serve queries.

    Ranges come one at a time (``("range", start, end, is_last)``) so that a worker that gets
    cheap ranges takes more of them; ``("finish",)`` ends the scanning.
    """
    import gc
    import time

    from skillrun.io import lifeline

    # Ends with the reading process (a SIGKILLed `skill-run` must not leave scanners behind).
    lifeline.die_with_parent(os.getppid(), deathsig=True)
    gc.disable()  # millions of small tuples, no cycles: the cyclic GC would only cost time
    shard = Shard()
    shard.path = path
    shard.prefixes = prefixes
    tail: dict = {}
    try:
        with open(path, "rb") as fh:
            while True:
                msg = conn.recv()
                if msg[0] != "range":
                    break
                _, start, end, is_last = msg
                fh.seek(start)
                left = [end - start]

                def read(n: int) -> bytes:
                    if left[0] <= 0:
                        return b""
                    b = fh.read(min(n, left[0]))
                    left[0] -= len(b)
                    return b

                def report(n: int) -> None:
                    conn.send(("progress", n))

                got = scan_stream(shard, read, prefixes, is_last, report, base=start)
                tail.update(got)
                conn.send(("ranged", None))
    except NoBoundary:
        conn.send(("error", "NoBoundary"))
        return
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    import resource

    serve(conn, shard, {"tail": tail, "cpu_s": time.process_time(),
                        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
