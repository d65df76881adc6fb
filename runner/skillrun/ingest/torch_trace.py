"""torch.profiler / Kineto Chrome-trace JSON (``.json``, ``.json.gz``; CUDA and ROCm; old and new).

Small files are parsed whole with orjson. Large ones are split at event boundaries and read by
worker processes with the byte-level scanner of :mod:`._kineto_shard`; each worker keeps its
tables and answers the linker's questions, so no process ever holds the whole trace.

Linking a kernel to the op whose shapes it ran (trace-formats.md §1):
kernel ``args.correlation`` → runtime/driver launch with that correlation → its ``External id``
→ the ``cpu_op`` with that ``External id`` (checked: on the launching thread and around the launch
time). Fallbacks: the kernel's own ``External id``; then the innermost ``cpu_op`` enclosing the
launch on the launching thread, preferring the innermost one that recorded ``Input Dims``.
Kernels replayed from a CUDA/HIP graph are never attributed through the graph launch.
One exception: a kernel launched inside a fused-MoE layer op whose Input Dims give a MoE shape is
linked to that layer op, not to the inner aten op (:func:`_attribute_layers`).
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import os
import threading
from array import array
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Optional

import orjson

from ..errors import InputError
from ..models import DeviceInfo, Profile
from . import _io
from ._jsonhead import BadJSON, parse_tail, skip_value, walk, walk_stream
from ._kineto_shard import BOUNDARY, NoBoundary, Shard, detect_prefixes, worker_range
from ._profile import (IMPOSSIBLE_DURATION, MAX_CALL_US, NEGATIVE_DURATION, NON_FINITE_DURATION, OpRef, ProfileBuilder,
                       busy_span_arrays, make_opref)
from .arch import devices_from_kineto

FORMAT = "kineto_json"
_CLEANUP: list = []  # temporary files of the current read, removed once linking is done
LAST_STATS: dict = {}  # how the last Kineto read went (shards, chunks read fast/slow): for tests and benchmarks
LAST_WORKERS: list = []  # per worker process of the last large read: scan CPU seconds, peak RSS
SMALL_LIMIT = 16 << 20  # below this (decompressed) the whole document is parsed at once
# The whole-document path reads at most max(4 x its limit, this) before it hands over to the
# streaming path (a gzip trailer's size is only a hint, and a crafted file can make it lie).
SMALL_READ_FLOOR = 64 << 20
LAUNCH_EPS_US = 1.0
_INF = float("inf")

Progress = Optional[Callable[[int, int], None]]


# ---------------------------------------------------------------------- shard handles
class _Local:
    def __init__(self, shard: Shard):
        self.shard = shard
        self._pending: list = []

    def call(self, name: str, *args: Any) -> Any:
        return getattr(self.shard, name)(*args)

    def send(self, name: str, *args: Any) -> None:
        self._pending.append((name, args))

    def receive(self) -> Any:
        name, args = self._pending.pop(0)
        return getattr(self.shard, name)(*args)

    def close(self) -> None:
        pass


class _Remote:
    def __init__(self, proc: mp.process.BaseProcess, conn: Any):
        self.proc = proc
        self.conn = conn

    def call(self, name: str, *args: Any) -> Any:
        self.send(name, *args)
        return self.receive()

    def send(self, name: str, *args: Any) -> None:
        self.conn.send((name, args))

    def receive(self) -> Any:
        status, val = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"trace worker failed: {val}")
        return val

    def close(self) -> None:
        try:
            self.conn.send(("close", ()))
            self.conn.recv()
        except (OSError, EOFError):
            pass
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()


def _mp_context() -> mp.context.BaseContext:
    # fork is instant and shares the loaded modules; it is only unsafe with other threads alive
    # (a progress bar's refresh thread), where forkserver starts clean children instead.
    if threading.active_count() == 1 and "fork" in mp.get_all_start_methods():
        return mp.get_context("fork")
    return mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")


# ---------------------------------------------------------------------- entry point
def ingest_kineto(path: Path, arch: Optional[str] = None, progress: Progress = None,
                  small_limit: int = SMALL_LIMIT, workers: Optional[int] = None) -> Profile:
    """Read a Kineto trace; ``small_limit`` (decompressed bytes) picks the whole-document path,
    ``workers`` the number of scanning processes of the large-file path (default: CPU count, ≤4)."""
    size_hint = _io.content_size_hint(path)
    builder = ProfileBuilder(str(path), FORMAT)
    _mark("start")
    with _io.sigterm_unwinds():  # Ctrl-C and SIGTERM both remove the decompressed temporary trace
        try:
            handles = None
            if size_hint <= small_limit:
                try:
                    # The size hint comes from the gzip trailer, which the file itself may falsify:
                    # the whole-document path stops reading past a few times the limit.
                    handles, props = _read_small(path, progress, limit=max(4 * small_limit, SMALL_READ_FLOOR))
                except _io.ContentTooLarge:
                    handles = None
            if handles is None:
                handles, props = _read_large(path, progress, workers)
        except BaseException:
            while _CLEANUP:
                _CLEANUP.pop()()
            raise
        try:
            _link(handles, builder)
        finally:
            for h in handles:
                h.close()
            while _CLEANUP:
                _CLEANUP.pop()()
    amd = builder.vendor_hint == "amd"
    builder.devices = devices_from_kineto(props, amd, builder.warnings)
    if not builder.devices and builder.kernel_devices:
        builder.devices = [DeviceInfo(index=d, vendor=builder.vendor_hint) for d in sorted(builder.kernel_devices)]
    return builder.build(arch)


def _parse_error(path: Path, exc: Exception) -> InputError:
    msg = str(exc)
    if isinstance(exc, BadJSON):
        msg = f"{exc.msg} (near byte {exc.pos})"
    return InputError(f"corrupt or truncated trace JSON: {msg}", path=str(path))


def _read_small(path: Path, progress: Progress, limit: int = _io.MAX_TRACE_BYTES) -> tuple[list, Any]:
    data = _io.read_content(path, limit=limit)
    if progress:
        progress(len(data), len(data))
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth limit" not in str(exc) and "recursion" not in str(exc):
            raise InputError(f"corrupt or truncated trace JSON ({exc})", path=str(path)) from None
        doc = _load_deep(path, data)
    del data
    if isinstance(doc, list):
        events, props = doc, None
    elif isinstance(doc, dict):
        events = doc.get("traceEvents")
        props = doc.get("deviceProperties")
        if not isinstance(events, list):
            raise InputError("'traceEvents' is not a list", path=str(path), field="traceEvents")
    else:
        raise InputError("JSON document is not a trace (neither an object nor an event list)", path=str(path))
    shard = Shard()
    shard.add_events(events)
    return [_Local(shard)], props


def _load_deep(path: Path, data: bytes) -> Any:
    """A valid trace whose metadata nests deeper than orjson's limit (1024): the top level is
    walked with the iterative skipper, values too deep to decode are dropped, and only the event
    list is decoded (an event list that itself nests that deep is refused as such)."""
    text = data.decode("latin-1")
    try:
        top = walk(text, {"traceEvents"}, None, complete=True)
        if top.kind == "array":
            start, end = top.stop_value_pos, len(data)
        else:
            if top.stop_key != "traceEvents":
                return top.values
            start = top.stop_value_pos
            end = skip_value(text, start, True) if text[start] in "[{" else start
        events = orjson.loads(data[start:end]) if end > start else None
        doc: Any = events if top.kind == "array" else {**top.values, "traceEvents": events, **parse_tail(text[end:])}
    except BadJSON as exc:
        raise _parse_error(path, exc) from None
    except orjson.JSONDecodeError as exc:
        raise InputError(f"trace events nest deeper than 1024 levels or are corrupt ({exc})", path=str(path)) from None
    return doc


# ---------------------------------------------------------------------- large files
def _read_large(path: Path, progress: Progress, workers: Optional[int]) -> tuple[list, Any]:
    gz = _io.is_gzip(path)
    total = _io.file_size(path)
    nworkers = max(1, min(4, workers or (os.cpu_count() or 1)))
    if not gz:
        with open(path, "rb") as fh:
            try:
                top, head = walk_stream(fh.read, {"traceEvents"}, {"deviceProperties"})
            except BadJSON as exc:
                raise _parse_error(path, exc) from None
        start = _array_start(path, top, head)
        sample = _read_at(path, start, 4 << 20)
        prefixes = detect_prefixes(sample)
        try:
            handles, tail = _run_ranges(path, start, total, prefixes, nworkers, progress)
        except NoBoundary:
            return _read_ijson(path, top, progress)
    else:
        try:
            handles, tail, top = _run_gzip(path, nworkers, progress)
        except NoBoundary:
            return _read_ijson(path, None, progress)
    props = top.values.get("deviceProperties") if top is not None else None
    if props is None:
        props = tail.get("deviceProperties")
    return handles, props


def _array_start(path: Path, top: Any, head: bytes) -> int:
    pos = top.stop_value_pos
    if top.kind == "object" and top.stop_key != "traceEvents":
        raise InputError("JSON document has no 'traceEvents'", path=str(path))
    if pos < 0 or pos >= len(head) or head[pos:pos + 1] != b"[":
        raise InputError("'traceEvents' is not a list", path=str(path), field="traceEvents")
    return pos + 1


def _read_at(path: Path, offset: int, n: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(n)


RANGES_PER_WORKER = 8  # more ranges than workers: the GPU half of a trace costs more per byte


def _run_ranges(path: Path, start: int, end: int, prefixes: Optional[dict], nworkers: int,
                progress: Progress) -> tuple[list, dict]:
    # Split [start, end) at event boundaries into equal shares; workers pull them one by one.
    nranges = max(1, nworkers * RANGES_PER_WORKER) if end - start > (8 << 20) else nworkers
    cuts: list[tuple[int, int]] = []
    span = end - start
    for k in range(1, nranges):
        want = start + span * k // nranges
        m = None
        for width in (256 << 10, 4 << 20):  # an event boundary is normally a few hundred bytes away
            window = _read_at(path, want, width)
            m = BOUNDARY.search(window)
            if m is not None:
                break
        if m is None:
            continue
        c = want + m.start() + 1
        nxt = want + window.find(b"{", m.start() + 1)
        if c > (cuts[-1][1] if cuts else start):
            cuts.append((c, nxt))
    bounds = []
    prev = start
    for cut_end, next_start in cuts:
        bounds.append((prev, cut_end, False))
        prev = next_start
    bounds.append((prev, end, True))
    todo = list(bounds)
    ctx = _mp_context()
    procs = []
    for _ in range(min(nworkers, len(bounds))):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=worker_range, args=(child, str(path), prefixes), daemon=True)
        p.start()
        child.close()
        parent.send(("range",) + todo.pop(0))
        procs.append((p, parent))
    return _collect(path, procs, progress, end, first_done=start, todo=todo)


def _collect(path: Path, procs: list, progress: Progress, total: int, first_done: int,
             todo: Optional[list] = None) -> tuple[list, dict]:
    done = first_done
    todo = todo if todo is not None else []
    pending = {conn: p for p, conn in procs}
    firsts: dict[Any, dict] = {}
    error: Optional[str] = None
    while pending:
        for conn in wait(list(pending)):
            try:
                kind, val = conn.recv()
            except EOFError:
                error = error or "a trace worker exited unexpectedly"
                pending.pop(conn)
                continue
            if kind == "progress":
                done += val
                if progress:
                    progress(min(done, total), total)
            elif kind == "ranged":
                if todo and not error:
                    conn.send(("range",) + todo.pop(0))
                else:
                    conn.send(("finish",))
            elif kind == "done":
                firsts[conn] = val
                _mark(f"worker done (cpu {val.get('cpu_s', 0):.2f}s)")
                pending.pop(conn)
            else:
                error = error or val
                pending.pop(conn)
    handles = [_Remote(p, conn) for p, conn in procs]
    if progress and not error:
        progress(total, total)
    if error:
        for h in handles:
            if h.conn in firsts:
                h.close()
            else:
                h.proc.join(timeout=5)
        if error == "NoBoundary":
            raise NoBoundary()
        raise InputError(f"corrupt or truncated trace JSON: {error}", path=str(path))
    tail: dict = {}
    for v in firsts.values():
        if v.get("tail"):
            tail.update(v["tail"])
    LAST_WORKERS[:] = [{"cpu_s": v.get("cpu_s"), "rss_mb": v.get("rss_mb")} for v in firsts.values()]
    return handles, tail


GZ_RANGE = 32 << 20  # decompressed bytes per range handed to a worker while decompression goes on


def _run_gzip(path: Path, nworkers: int, progress: Progress) -> tuple[list, dict, Any]:
    """Decompress into a temporary file while workers already scan what has been written.

    The fast path reads ops lazily by file offset, which needs a seekable file. Decompression
    (one stream, this process) and scanning (the workers) overlap: each time another
    ``GZ_RANGE`` bytes are on disk, the span up to the last event boundary becomes a range.
    """

    hint = max(1, _io.content_size_hint(path))
    from skillrun.io import lifeline

    # Named for this process, so that the next run removes it if this one is killed mid-read.
    tmpdir = lifeline.temp_dir("trace")
    _CLEANUP.append(tmpdir.cleanup)
    raw = Path(tmpdir.name) / "trace.json"
    # Small output blocks stay in cache (~2x faster); the copy may use most of the free disk, no more.
    stream = _io.iter_decompressed(path, 256 << 10, budget=_io.disk_budget(tmpdir.name))
    try:
        out = open(raw, "wb")
    except OSError as exc:
        raise InputError(f"cannot create a temporary file ({exc.strerror or exc})", path=str(path)) from None
    written = 0
    pending = bytearray()
    eof = [False]

    def pull() -> bytes:
        nonlocal written
        try:
            b = next(stream)
        except StopIteration:
            eof[0] = True
            return b""
        out.write(b)
        written += len(b)
        return b

    def read(n: int) -> bytes:  # for the header walk: bytes in file order
        while len(pending) < n and not eof[0]:
            pending.extend(pull())
        r = bytes(pending[:n])
        del pending[:n]
        return r

    procs: list = []
    try:
        try:
            top, head = walk_stream(read, {"traceEvents"}, {"deviceProperties"})
        except BadJSON as exc:
            raise _parse_error(path, exc) from None
        start = _array_start(path, top, head)
        window = bytes(head[start:]) + bytes(pending)
        while len(window) < (4 << 20) and not eof[0]:
            window += pull()
        pending.clear()
        prefixes = detect_prefixes(window[:4 << 20])
        ctx = _mp_context()
        for _ in range(nworkers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_range, args=(child, str(raw), prefixes), daemon=True)
            p.start()
            child.close()
            procs.append((p, parent))
        idle = [conn for _, conn in procs]
        todo: list[tuple] = []
        cut_from = start
        recent = window  # the newest decompressed bytes (to find a boundary in)
        recent_at = written - len(window)
        while not eof[0]:
            b = pull()
            if b:
                recent = recent[-(256 << 10):] + b
                recent_at = written - len(recent)
            if written - cut_from >= GZ_RANGE:
                last = None
                # the last boundary in the newest megabyte (never before the current range start)
                for m in BOUNDARY.finditer(recent, max(0, cut_from - recent_at, len(recent) - (1 << 20))):
                    last = m
                if last is not None:
                    cut_end = recent_at + last.start() + 1
                    nxt = recent.find(b"{", last.start() + 1)
                    out.flush()
                    todo.append((cut_from, cut_end, False))
                    cut_from = recent_at + nxt
            for conn in [c for _, c in procs]:
                while conn.poll():
                    kind, val = conn.recv()
                    if kind == "ranged":
                        idle.append(conn)
                    elif kind in ("error",):
                        raise InputError(f"corrupt or truncated trace JSON: {val}", path=str(path))
            while idle and todo:
                idle.pop(0).send(("range",) + todo.pop(0))
            if progress:
                progress(min(written, hint - 1), hint)
        out.close()
        todo.append((cut_from, written, True))
        while idle and todo:
            idle.pop(0).send(("range",) + todo.pop(0))
        for conn in idle:
            conn.send(("finish",))
    except BaseException:
        out.close()
        for p, _ in procs:
            p.terminate()
        raise
    handles, tail = _collect(path, procs, None, written, written, todo=todo)
    if progress:
        progress(hint, hint)
    return handles, tail, top


def _read_ijson(path: Path, top: Any, progress: Progress) -> tuple[list, Any]:
    """Last resort for documents that cannot be cut into chunks: stream every event with ijson."""
    import gzip

    import ijson

    shard = Shard()
    opener = gzip.open if _io.is_gzip(path) else open
    prefix = "item" if (top is not None and top.kind == "array") else "traceEvents.item"
    try:
        with opener(path, "rb") as fh:
            batch = []
            for ev in ijson.items(fh, prefix, use_float=True):
                batch.append(ev)
                if len(batch) >= 20000:
                    shard.add_events(batch)
                    batch = []
            shard.add_events(batch)
    except (ijson.JSONError, ValueError, OSError, EOFError) as exc:
        raise InputError(f"corrupt or truncated trace JSON ({str(exc)[:200]})", path=str(path)) from None
    props = top.values.get("deviceProperties") if top is not None else None
    return [_Local(shard)], props


# ---------------------------------------------------------------------- linking
def _link(handles: list, builder: ProfileBuilder) -> None:
    gc_was = gc.isenabled()
    gc.disable()
    try:
        _link_inner(handles, builder)
    finally:
        if gc_was:
            gc.enable()


def _all(handles: list, name: str, args_per_handle: Optional[list] = None) -> list:
    """Ask every shard at once (workers answer in parallel), then collect the answers in order."""
    for i, h in enumerate(handles):
        h.send(name, *(args_per_handle[i] if args_per_handle is not None else ()))
    return [h.receive() for h in handles]


_T0: list = [0.0]


def _mark(label: str) -> None:
    """Phase timings on stderr when SKILLRUN_INGEST_TIMING is set (for benchmarking only)."""
    if os.environ.get("SKILLRUN_INGEST_TIMING"):
        import sys
        import time

        now = time.perf_counter()
        print(f"[ingest] {label}: {now - _T0[0]:.2f}s", file=sys.stderr)
        _T0[0] = now


def _link_inner(handles: list, builder: ProfileBuilder) -> None:
    _mark("scan")
    tables = _all(handles, "kernel_table")
    _mark("kernel tables")
    builder.graph_launches = sum(t["graph_launches"] for t in tables)
    builder.captures = sum(t.get("captures", 0) for t in tables)
    builder.captured_launches = sum(t.get("captured_launches", 0) for t in tables)
    if any(t["hip"] for t in tables):
        builder.vendor_hint = "amd"
    elif any(t["cuda"] for t in tables):
        builder.vendor_hint = "nvidia"
    LAST_STATS.clear()
    LAST_STATS.update(shards=len(handles), fast_chunks=sum(t["fast_chunks"] for t in tables),
                      slow_chunks=sum(t["slow_chunks"] for t in tables), workers=list(LAST_WORKERS))
    LAST_WORKERS.clear()
    bad = sum(t["events_bad"] for t in tables)
    if bad:
        builder.warnings.append(f"{bad} kernel events without a numeric duration were skipped")

    # 1. Launches not found in the kernel's own shard: ask the others.
    missing: list[set] = [set() for _ in handles]
    for si, t in enumerate(tables):
        for c, l in zip(t["kcorr"], t["launch"]):
            if l is None and c >= 0:
                missing[si].add(c)
    if any(missing) and len(handles) > 1:
        for si, t in enumerate(tables):
            if not missing[si]:
                continue
            found: dict[int, tuple] = {}
            for sj, h in enumerate(handles):
                if sj != si:
                    found.update(h.call("lookup_launches", missing[si]))
            t["launch"] = [found.get(c) if l is None and c >= 0 else l for c, l in zip(t["kcorr"], t["launch"])]

    _mark("launch lookups")
    # 2. Candidate External id per kernel (graph replays: only the kernel's own id).
    wanted: set[int] = set()
    cand_cols = []
    for t in tables:
        cand = []
        for ext, g, l in zip(t["kext"], t["kgraph"], t["launch"]):
            if l is not None and l[1]:
                cand.append(ext)
            elif g:
                cand.append(ext)
            elif l is not None and l[0] >= 0:
                cand.append(l[0])
            else:
                cand.append(ext)
        cand_cols.append(cand)
        wanted.update(x for x in cand if x >= 0)

    _mark("candidates")
    # 3. Ops for those ids, from every shard.
    ops: dict[int, tuple] = {}
    opkeys: dict[tuple, Any] = {}  # (shard, local opkey id) → OpRef
    for si, (found, used) in enumerate(_all(handles, "lookup_ops", [(wanted,)] * len(handles))):
        for ext, v in found.items():
            ops[ext] = (si,) + v
        for oid, key in used.items():
            opkeys[(si, oid)] = key
    _mark("op lookups")
    # 4. Validate each ext link against the launch; queue nesting lookups.
    link: list[list] = []
    # (thread, op start) of each kernel's launching op call, for per-batch loop inference (._loops).
    when: list[list] = []
    queries: list[tuple] = []
    qref: list[tuple] = []
    for ti, t in enumerate(tables):
        col = []
        wcol = []
        for ki, (x, l, g) in enumerate(zip(cand_cols[ti], t["launch"], t["kgraph"])):
            graph = bool(g) or (l is not None and l[1])
            op = ops.get(x) if x >= 0 else None
            if op is not None and l is not None and not l[1] and l[3] >= 0:
                # (shard, oid, ts, dur, tid): the op must enclose the launch on the same thread.
                if op[4] != l[2] or not (op[2] - LAUNCH_EPS_US <= l[3] <= op[2] + op[3] + LAUNCH_EPS_US):
                    op = None
            key = (op[0], op[1]) if op is not None else None
            col.append(key)
            wcol.append((op[4], op[2]) if op is not None and not graph else None)
            has_dims = key is not None and opkeys[key][2]
            if not graph and not has_dims and l is not None and l[3] >= 0:
                queries.append((l[2], l[3]))
                qref.append((ti, ki))
        link.append(col)
        when.append(wcol)

    if queries:
        best_any: list[Optional[tuple]] = [None] * len(queries)  # (op start, shard, opkey id)
        best_dims: list[Optional[tuple]] = [None] * len(queries)
        for si, (res, used) in enumerate(_all(handles, "nest", [(queries,)] * len(handles))):
            for oid, key in used.items():
                opkeys[(si, oid)] = key
            for qi, (a_oid, a_ts, d_oid, d_ts) in enumerate(res):
                if a_oid >= 0 and (best_any[qi] is None or a_ts > best_any[qi][0]):
                    best_any[qi] = (a_ts, si, a_oid)
                if d_oid >= 0 and (best_dims[qi] is None or d_ts > best_dims[qi][0]):
                    best_dims[qi] = (d_ts, si, d_oid)
        for qi, (ti, ki) in enumerate(qref):
            bd, ba = best_dims[qi], best_any[qi]
            tid = queries[qi][0]
            if bd is not None:
                link[ti][ki] = (bd[1], bd[2])
                when[ti][ki] = (tid, bd[0])
            elif link[ti][ki] is None and ba is not None:
                link[ti][ki] = (ba[1], ba[2])
                when[ti][ki] = (tid, ba[0])

    _attribute_layers(handles, tables, link, when, opkeys)
    _mark("validate+nest")
    # 5. Aggregate per (name, device, op, graph) and hand over to the builder.
    refs: dict[tuple, OpRef] = {}
    bad_sigs = 0
    groups: dict[tuple, list] = {}
    kernel_devices: set[int] = set()
    negative = infinite = impossible = 0
    spans: dict[int, list] = {}
    work_items: set[str] = set()  # kernels launched by a call whose grid is in work-items (hipExtModuleLaunchKernel)
    for ti, t in enumerate(tables):
        names = t["names"]
        for nid, dur, dev, g, l, key in zip(t["kname"], t["kdur"], t["kdev"], t["kgraph"], t["launch"], link[ti]):
            if l is not None and len(l) > 4 and l[4]:
                work_items.add(names[nid])
            if not 0.0 <= dur < MAX_CALL_US:  # one comparison per kernel: negative, infinite or impossible
                if dur < 0:
                    negative += 1
                elif dur < _INF:
                    impossible += 1
                else:
                    infinite += 1
                dur = 0.0  # counted in Profile.anomalies, left out of the shares
            graph = bool(g) or (l is not None and l[1])
            gk = (names[nid], dev, key, graph)
            acc = groups.get(gk)
            if acc is None:
                groups[gk] = [dur, 1, ti, nid, dur, dur, array("d", (dur,))]
            else:
                acc[0] += dur
                acc[1] += 1
                if dur < acc[4]:
                    acc[4] = dur
                if dur > acc[5]:
                    acc[5] = dur
                acc[6].append(dur)  # per-call durations: median and std-dev
        for dev, ts, dur in zip(t["kdev"], t.get("kts", ()), t["kdur"]):
            if ts == ts and dur >= 0:
                col = spans.get(dev)
                if col is None:
                    col = spans[dev] = [array("d"), array("d")]
                col[0].append(ts)
                col[1].append(ts + dur)
    for dev, (starts, ends) in spans.items():
        busy, span = busy_span_arrays(starts, ends)
        builder.timeline(dev if dev >= 0 else None, busy, span)
    geometry: dict[str, dict] = {}
    for t in tables:
        for nid, counts in t["kgrid"].items():
            acc = geometry.setdefault(t["names"][nid], {})
            for gb, n in counts.items():
                acc[gb] = acc.get(gb, 0) + n
    launch_facts: dict[str, dict] = {}  # kernel name → registers / shared memory (CUPTI kernel args)
    for t in tables:
        for nid, facts in t.get("klaunch", {}).items():
            launch_facts.setdefault(t["names"][nid], facts)
    chosen: dict[str, tuple] = {}
    for name, counts in geometry.items():
        known = {gb: n for gb, n in counts.items() if gb[0] is not None} or counts
        best = max(known.items(), key=lambda kv: (kv[1], tuple(-x for x in (kv[0][0] or ()))))[0]
        grid, block = (list(best[0]) if best[0] else None, list(best[1]) if best[1] else None)
        if name in work_items and grid and block and len(grid) == len(block) and all(b > 0 for b in block):
            # workgroups, as every other format and CUDA's blocks count them
            grid = [-(-g // b) for g, b in zip(grid, block)]
        chosen[name] = (grid, block)
    for (name, dev, key, graph), (dur, calls, ti, nid, lo, hi, samples) in groups.items():
        ref = None
        if key is not None:
            ref = refs.get(key)
            if ref is None:
                opname, sig, has_dims = opkeys[key]
                args = None
                if sig:
                    try:
                        args = orjson.loads(b"{" + sig + b"}")
                    except orjson.JSONDecodeError:
                        bad_sigs += 1
                ref = refs[key] = make_opref(opname, args)
        if dev >= 0:
            kernel_devices.add(dev)
        grid, block = chosen.get(name, (None, None))
        builder.add(name, dur, calls, device=dev if dev >= 0 else None, op=ref, graph=graph, grid=grid, block=block,
                    min_us=lo, max_us=hi, samples=samples, launch=launch_facts.get(name))
    _mark("aggregate")
    builder.note(NEGATIVE_DURATION, negative)
    builder.note(NON_FINITE_DURATION, infinite)
    builder.note(IMPOSSIBLE_DURATION, impossible)
    _infer_loops(tables, link, when, refs, builder)
    if bad_sigs:
        builder.warnings.append(f"{bad_sigs} launching ops had unreadable argument records (shapes skipped)")
    builder.kernel_devices = kernel_devices




def _attribute_layers(handles: list, tables: list, link: list, when: list, opkeys: dict) -> None:
    """Kernels launched inside a fused-MoE layer op belong to that layer.

    A MoE layer written in PyTorch (a loop of per-expert GEMMs, or vLLM's fused experts with their
    torch glue) launches its kernels through inner aten ops (``aten::_scaled_mm``, ``aten::index``…)
    that alone look like dense work; the enclosing layer op (``_kineto_shard.LAYER_OP``, registered
    as a custom op by the stack or the workload) is what says "MoE" and carries the layer's shape.
    A launch on the same thread inside such an op is re-linked to it, once its Input Dims resolve a
    MoE shape (shapes._rule_moe: tokens and experts); otherwise nothing changes. Graph replays are
    left alone (their launching op is not the replay's context)."""
    layers = [lay for t in tables for lay in t.get("layers", ())]
    if not layers:
        return
    from bisect import bisect_right

    from skillrun.ingest.shapes import op_shape

    exts = {lay[3] for lay in layers}
    found: dict[int, tuple] = {}
    for si, (res, used) in enumerate(_all(handles, "lookup_ops", [(exts,)] * len(handles))):
        for ext, v in res.items():
            found[ext] = (si,) + v
        for oid, key in used.items():
            opkeys[(si, oid)] = key
    by_tid: dict[Any, list] = {}
    for tid, start, end, ext in layers:
        op = found.get(ext)
        if op is None:
            continue
        key = (op[0], op[1])
        name, sig, has_dims = opkeys[key]
        if not has_dims:
            continue
        try:
            args = orjson.loads(b"{" + sig + b"}")
        except orjson.JSONDecodeError:
            continue
        shape = op_shape(name, args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs")).shape or {}
        if "tokens" in shape and "experts" in shape:
            by_tid.setdefault(tid, []).append((start, end, key))
    for lst in by_tid.values():
        lst.sort(key=lambda x: x[0])
    starts = {tid: [x[0] for x in lst] for tid, lst in by_tid.items()}
    for ti, t in enumerate(tables):
        for ki, (l, g) in enumerate(zip(t["launch"], t["kgraph"])):
            if g or l is None or l[1] or l[3] < 0 or l[2] not in by_tid:
                continue
            lst = by_tid[l[2]]
            i = bisect_right(starts[l[2]], l[3] + LAUNCH_EPS_US) - 1
            # the nearest layer op starting before the launch; nested layer ops are not expected
            if i >= 0 and lst[i][1] + LAUNCH_EPS_US >= l[3]:
                link[ti][ki] = lst[i][2]
                when[ti][ki] = (l[2], lst[i][0])


def _infer_loops(tables: list, link: list, when: list, refs: dict, builder: ProfileBuilder) -> None:
    """Runs of identical launching ops inside one profiler step → ``batch`` for those ops (see ._loops)."""
    from ._loops import loop_batches

    inst = [(w[0], w[1], key) for col, wcol in zip(link, when) for key, w in zip(col, wcol)
            if key is not None and w is not None]
    if not inst:
        return
    steps = [s for t in tables for s in t.get("steps", ())]
    for key, n in loop_batches(inst, steps).items():
        ref = refs.get(key)
        if ref is not None and ref.dims is not None:
            builder.loop_batch[(ref.name, ref.dims, ref.types)] = n
