"""Slot integrity: prove which kernel ran in each timed slot.

A port that secretly calls the vendor kernel, or returns the baseline's output, would time and
verify as "correct and fast". Two checks catch that:

* **names**: torch.profiler records a sample of each slot's launches. On a GPU the device kernel
  names seen must all match the slot's ``KernelLaunch.expect_kernels`` regex and none may match
  another slot's. On a CPU there are no device kernels; host ops and ``record_function`` scopes are
  checked instead against ``describe["expect_host_ops"]`` (falling back to ``expect_kernels``):
  another slot's ops must not appear, and a slot that declares host ops must show them.
* **aliasing**: the port's output must not share storage with any input or prepared operand or
  another slot's output in its process (a "kernel" returning its input, or a cached result); checked
  on the first call and again on every timed output (slot_server.Server.commit). The references run
  in another process, so their buffers are out of reach.
* **timed rounds observed in place**: besides the launches profiled before timing, a few timed
  rounds at random positions are profiled (RoundObserver), so a port that behaves on its first calls
  only is seen; every profiled round is checked by the referee, and a port faster when watched than
  on any plain launch fails (worker._finish_gate); on a replayed CUDA graph it cannot branch at all.
* **input checksums** (``digests``): every byte of each operand's storage, before and after a
  candidate's calls. A write restored bit for bit before the call returns is not visible this way.
* **output commitments** (``output_digest``): SHA-256 of an output's dtype, shape and bytes, in the
  reply to its launch; the referee holds the bytes handed over to it (referee.py).

``evaluate_names`` is pure so it can be tested without a profiler.
"""
from __future__ import annotations

import os

import re
from typing import Any, Callable, Iterable

from skillrun.ingest.names import short_name

# Scopes the harness itself opens around launches; never counted as a slot's own work.
HARNESS_SCOPE = "skillrun::slot"
_IGNORED_HOST = re.compile(r"^(skillrun::|ProfilerStep|\[memory\]|cudaDeviceSynchronize|hipDeviceSynchronize)")


def _search(regex: str, name: str) -> bool:
    try:
        return re.search(regex, name) is not None
    except re.error:
        return False


def evaluate_names(slot: str, own: str | None, others: dict[str, str | None], names: Iterable[str], *, device: bool,
                   own_required: bool = True) -> dict[str, Any]:
    """One gate for one slot from the names seen in its profiled window.

    ``device``: the names are device kernels (strict: all must be the slot's own). Otherwise they
    are host events (loose: only foreign names fail, and the own regex is required only when
    ``own_required``).
    """
    seen = sorted({n for n in names if n and not (not device and _IGNORED_HOST.search(n))})
    gate: dict[str, Any] = {"name": f"slot_integrity:{slot}", "passed": True, "value": seen[:20],
                            "limit": {"expect": own, "not": {k: v for k, v in others.items() if v}},
                            "level": "device kernels" if device else "host ops"}
    problems = []
    for bad in (f"{k}: invalid regex" for k, v in {slot: own, **others}.items() if v and not _valid(v)):
        problems.append(bad)
    foreign = {n: k for n in seen for k, rx in others.items() if rx and _search(rx, n)}
    if foreign:
        problems.append("saw kernels of another slot: " + ", ".join(f"{n} ({k})" for n, k in sorted(foreign.items())[:5]))
    if device:
        kernels = [n for n in seen if not _RUNTIME_FILL.search(n)]
        fills = sorted(set(seen) - set(kernels))
        if fills:
            gate["runtime_fills"] = fills
        if not own:
            problems.append("the slot declares no expect_kernels regex, so which kernel ran cannot be proven")
        elif not kernels:
            problems.append("no device kernel was recorded in the profiled window")
        else:
            unexpected = [n for n in kernels if not _search(own, n)]
            if unexpected:
                # Short forms: a demangled template runs to 1000+ characters and says no more here.
                problems.append(f"unexpected kernels (not matching {own!r}): "
                                + ", ".join(short_name(n, 120) for n in unexpected[:5]))
    elif own and own_required and not any(_search(own, n) for n in seen):
        problems.append(f"none of the host ops matches the slot's own {own!r}")
    if problems:
        gate["passed"] = False
        gate["reason"] = "; ".join(problems)
    else:
        gate["reason"] = (f"{len([n for n in seen if not _RUNTIME_FILL.search(n)])} device kernel name(s), all matching the "
                          "slot's regex, none another slot's" if device
                          else ("host ops only (no device kernels on this backend): "
                                + ("own ops seen, " if own and own_required else "own kernels not visible on the host, ")
                                + "no other slot's ops"))
    return gate


def _valid(rx: str) -> bool:
    try:
        re.compile(rx)
        return True
    except re.error:
        return False


# Runtime fills (cudaMemsetAsync / hipMemsetAsync) cannot carry a result from another slot, and vendor
# libraries issue them around their kernels (cuBLAS before some fp16 GEMMs on the H200), so they are
# listed but not held against a slot. Copies are not exempt: a memcpy can move a cached answer.
_RUNTIME_FILL = re.compile(r"^(Memset|memset|hipMemset)")


# The timing engine's own hold (torch.cuda._sleep) runs inside observed launches' profiler windows.
_HARNESS_SPIN = re.compile(r"^(void )?at::cuda::\(anonymous namespace\)::spin_kernel")


def _kernel_events(events: Iterable[Any]) -> list[Any]:
    out = []
    for e in events:
        dt = getattr(e, "device_type", None)
        on_device = dt is not None and getattr(dt, "name", str(dt)) not in ("CPU", "DeviceType.CPU")
        if on_device and not getattr(e, "is_user_annotation", False) and not _HARNESS_SPIN.search(e.name):
            out.append(e)
    return out


def device_busy_us(events: Iterable[Any]) -> float:
    """Microseconds the device was busy with kernels and copies (union of their intervals, so kernels
    that overlap on several streams are not counted twice); the harness's own spin excluded."""
    spans = []
    evs = list(events)
    host = {e.name for e in evs if getattr(getattr(e, "device_type", None), "name", "CPU") == "CPU"}
    for e in _kernel_events(evs):
        if e.name in host:
            continue
        tr = getattr(e, "time_range", None)
        if tr is not None and tr.end > tr.start:
            spans.append((float(tr.start), float(tr.end)))
    spans.sort()
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy


def split_events(events: Iterable[Any]) -> tuple[list[str], list[str]]:
    """(device activity names, host event names) from profiler events.

    ``record_function`` scopes are mirrored on the GPU timeline as user annotations (seen on the
    H200: ``skillrun::slot`` with a CUDA device type); they are not kernels and are dropped from the
    device list, by the event's flag where torch has it and by name (a name that is also a host
    event) otherwise.
    """
    device, host = [], []
    for e in events:
        dt = getattr(e, "device_type", None)
        on_device = dt is not None and getattr(dt, "name", str(dt)) not in ("CPU", "DeviceType.CPU")
        if on_device and _HARNESS_SPIN.search(e.name):
            continue
        (device if on_device and not getattr(e, "is_user_annotation", False) else host).append(e.name)
    host_set = set(host)
    return [n for n in device if n not in host_set], host


def profile_names(fn: Callable[[], Any], launches: int, use_device: bool, sync: Callable[[], None]) -> tuple[list[str], list[str]]:
    """(device kernel names, host event names) seen while calling ``fn`` ``launches`` times."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU]
    if use_device:
        acts.append(ProfilerActivity.CUDA)
    with profile(activities=acts) as prof:
        for _ in range(launches):
            with record_function(HARNESS_SCOPE):
                fn()
        sync()
    return split_events(prof.events())


def tensors_in(obj: Any, depth: int = 0) -> list[Any]:
    """Every tensor reachable from a prepared-operand structure (dicts, lists, dataclasses)."""
    import torch

    if depth > 6:
        return []
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v, depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_in(v, depth + 1)]
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return [t for v in vars(obj).values() for t in tensors_in(v, depth + 1)]
    return []


def _span(t: Any) -> tuple[int, int]:
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def aliasing_gate(port_out: Any, others: dict[str, Any]) -> dict[str, Any]:
    """Fail if the port's output overlaps the storage of any tensor in ``others`` (label -> tensors)."""
    lo, hi = _span(port_out)
    hits = []
    for label, tensors in others.items():
        for t in tensors_in(tensors):
            a, b = _span(t)
            if a < hi and lo < b and (hi > lo):
                hits.append(label)
                break
    gate = {"name": "port_output_aliasing", "passed": not hits, "value": sorted(set(hits))}
    gate["reason"] = ("the port's output shares memory with " + ", ".join(sorted(set(hits)))
                      + ": it did not compute its own result") if hits else "the port's output is its own memory"
    return gate


# ----------------------------------------------------------------------------------------------
# input checksums: a port that writes to its operands is caught between its calls

# Position-sensitive sums over the storage's bytes read as int32 words in rows of _COLS: the total
# catches any changed word, the row- and column-weighted sums catch two words swapped (a plain sum or
# xor would not). int64 products may wrap; that is fine for a checksum (integer addition mod 2**64 is
# associative, so the result does not depend on the reduction order of the device).
_COLS = 1024
_CHUNK_ROWS = 1 << 16  # 64K x 1024 words (256 MiB) per step: bounds the int64 temporaries on big weights
DIGEST_METHOD = ("int32 words of each operand's whole storage: total, row-weighted and column-weighted sums "
                 "(int64, on the operand's device)")


def _digest_parts(t: Any) -> Any:
    """A 1-D int64 tensor (on t's device) summarising every byte of t's storage."""
    import torch

    s = t.untyped_storage()
    n = s.nbytes()
    dev = t.device
    u = torch.empty(0, dtype=torch.uint8, device=dev).set_(s, 0, (n,), (1,))
    n4 = n // 4
    words = u[: n4 * 4].view(torch.int32)
    rows = n4 // _COLS
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    total, rowmix = zero.clone(), zero.clone()
    colsum = torch.zeros(_COLS, dtype=torch.int64, device=dev)
    for r0 in range(0, rows, _CHUNK_ROWS):
        r1 = min(rows, r0 + _CHUNK_ROWS)
        blk = words[r0 * _COLS: r1 * _COLS].view(r1 - r0, _COLS)
        rs = blk.sum(1, dtype=torch.int64)
        total += rs.sum()
        rowmix += (rs * torch.arange(r0 + 1, r1 + 1, dtype=torch.int64, device=dev)).sum()
        colsum += blk.sum(0, dtype=torch.int64)
    colmix = (colsum * torch.arange(1, _COLS + 1, dtype=torch.int64, device=dev)).sum()
    rest = torch.cat([words[rows * _COLS:].to(torch.int64), u[n4 * 4:].to(torch.int64)])
    restmix = (rest * torch.arange(1, rest.numel() + 1, dtype=torch.int64, device=dev)).sum()
    return torch.stack([torch.full((), n, dtype=torch.int64, device=dev), total, rowmix, colmix, restmix])


# Output commitments: SHA-256 over the output's dtype, shape and bytes. Large outputs are hashed in
# chunks on several threads (hashlib releases the GIL) and the chunk digests hashed again: a two-level
# hash tree, as collision-resistant as SHA-256 itself. (The input checksums above stay linear: they only
# need to notice a write, not to bind a party that crafts bytes.)
_CHUNK = 4 << 20
_THREADS = max(2, min(16, os.cpu_count() or 2))
OUTPUT_DIGEST = "sha256 of dtype, shape and the output's bytes (row-major; 4 MiB chunks hashed, then their digests)"


def bytes_digest(data: Any, dtype: str, shape: list[int]) -> str:
    """The commitment to an output given as its raw bytes (a buffer), its dtype name and shape."""
    import hashlib
    import threading

    view = memoryview(data).cast("B")
    chunks = [view[i:i + _CHUNK] for i in range(0, len(view), _CHUNK)] or [view]
    leaves: list[bytes] = [b""] * len(chunks)

    def work(k: int) -> None:
        for i in range(k, len(chunks), _THREADS):
            leaves[i] = hashlib.sha256(chunks[i]).digest()

    if len(chunks) > 2:
        threads = [threading.Thread(target=work, args=(k,), name="skillrun-digest") for k in range(min(_THREADS, len(chunks)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        work_all = [hashlib.sha256(c).digest() for c in chunks]
        leaves[:] = work_all
    head = f"skillrun-output-v1 {dtype} {','.join(str(int(x)) for x in shape)} {len(view)}\n".encode()
    return hashlib.sha256(head + b"".join(leaves)).hexdigest()


def output_digest(out: Any) -> str:
    """The commitment to one output (a plain tensor, judge.plain): its dtype, shape and row-major bytes,
    the same on any device. Computed with torch functions and Python dispatch turned off (guard.harness),
    so no mode the port pushed runs while the harness reads the output."""
    import torch

    from skillrun.execute import guard

    dtype, shape = str(out.dtype).removeprefix("torch."), list(out.shape)
    with guard.harness():
        flat = out.detach().contiguous().reshape(-1)
        if not flat.numel():
            return bytes_digest(b"", dtype, shape)
        u8 = flat.view(torch.uint8)
        if u8.device.type == "cpu":
            return bytes_digest(u8.numpy(), dtype, shape)
        with _HOST_LOCK:  # the reused buffer holds these bytes until they are hashed
            return bytes_digest(host_bytes(u8), dtype, shape)


# Reused page-locked host buffers for the device outputs' bytes, by size. A fresh pageable copy of every
# launch's output was most of the ~465 ms each launch request of a 512 MiB output took on the H200 (the
# host pages faulted in and zeroed, then a pageable transfer); a pinned buffer is written at the link's
# speed. A few sizes are kept (a process serves one card's shapes, one output each), 4 GiB at most.
_HOST_BUFFERS: "dict[int, Any]" = {}
_HOST_LOCK = __import__("threading").Lock()
_HOST_KEEP, _HOST_MAX_BYTES = 3, 4 << 30


def host_bytes(u8: Any, alloc: Any = None) -> Any:
    """The bytes of a flat uint8 device tensor as a host array, copied into a reused pinned buffer (``alloc(n)``
    makes one; pageable when pinning fails, e.g. a memlock limit). The array is valid until the next call:
    callers hold _HOST_LOCK until they are done with it."""
    import torch

    n = int(u8.numel())
    buf = _HOST_BUFFERS.pop(n, None)
    if buf is None and n <= _HOST_MAX_BYTES:
        try:
            buf = (alloc or (lambda k: torch.empty(k, dtype=torch.uint8, pin_memory=True)))(n)
        except RuntimeError:
            buf = None
    if buf is None:
        return u8.cpu().numpy()
    buf.copy_(u8)  # to page-locked memory: synchronous, so the bytes are there when this returns
    _HOST_BUFFERS[n] = buf  # most recently used last
    while len(_HOST_BUFFERS) > _HOST_KEEP or sum(int(b.numel()) for b in _HOST_BUFFERS.values()) > _HOST_MAX_BYTES:
        _HOST_BUFFERS.pop(next(iter(_HOST_BUFFERS)))
    return buf.numpy()


def digests(inputs: Any) -> dict[str, tuple[int, ...]]:
    """name -> checksum of every tensor in ``inputs`` (a dict of the problem's inputs), one device sync."""
    import torch

    from skillrun.execute import guard

    named = _named_tensors(inputs)
    if not named:
        return {}
    with guard.harness():  # no mode the port pushed runs while the harness reads its inputs
        return _digests(named)


def _digests(named: list) -> dict[str, tuple[int, ...]]:
    import torch

    parts = [_digest_parts(t) for _, t in named]
    by_dev: dict[Any, list[int]] = {}
    for i, (_, t) in enumerate(named):
        by_dev.setdefault(t.device, []).append(i)
    values: list[Any] = [None] * len(named)
    for idx in by_dev.values():  # one transfer (sync) per device, not one per tensor
        rows = torch.stack([parts[i] for i in idx]).tolist()
        for i, row in zip(idx, rows):
            values[i] = tuple(int(v) for v in row)
    return {name: values[i] for i, (name, _) in enumerate(named)}


def changed(before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]) -> list[str]:
    """Names whose checksum differs (or that appeared/disappeared) between two ``digests``."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def _named_tensors(obj: Any) -> list[tuple[str, Any]]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [("input", obj)]
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            if isinstance(v, torch.Tensor):
                out.append((str(k), v))
            else:
                out.extend((f"{k}[{i}]", t) for i, t in enumerate(tensors_in(v)))
        return out
    return [(f"input[{i}]", t) for i, t in enumerate(tensors_in(obj))]


# ----------------------------------------------------------------------------------------------
# profiled rounds inside the timed sequence


class RoundObserver:
    """Profiles one slot's launch at a time in the timed rounds the timing loop picked at random.

    Each observed launch gets its own profiler session, so the names seen belong to that slot alone
    (no scope bookkeeping). The profiler's start/stop cost does fall inside those launches' measured
    intervals, which is why timing.interleave keeps observed rounds out of the statistics.
    """

    def __init__(self, use_device: bool) -> None:
        self.use_device = use_device
        self.seen: dict[str, list[tuple[int, list[str], list[str]]]] = {}
        self.round = -1
        self.errors: dict[str, str] = {}
        self.kernel_us: dict[str, list[float]] = {}

    def __call__(self, slot: str) -> Any:
        from contextlib import contextmanager

        @contextmanager
        def ctx():
            from torch.profiler import ProfilerActivity, profile, record_function

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.use_device else [])
            try:
                prof = profile(activities=acts)
                prof.__enter__()
            except Exception as exc:  # a profiler that cannot start proves nothing: the gate says so
                self.errors.setdefault(slot, f"profiler failed in timed round {self.round}: {exc}")
                yield
                return
            try:
                with record_function(HARNESS_SCOPE):
                    yield
            finally:
                prof.__exit__(None, None, None)  # synchronizes the device: every kernel is recorded
                events = prof.events()
                dev, host = split_events(events)
                self.seen.setdefault(slot, []).append((self.round, dev, host))
                if self.use_device:
                    self.kernel_us.setdefault(slot, []).append(device_busy_us(events))

        return ctx()

    def kernel_ms(self) -> dict[str, list[float]]:
        """The second clock: per slot, the device time the profiler saw in each observed launch (ms)."""
        return {k: [round(v / 1e3, 6) for v in vs] for k, vs in self.kernel_us.items()}

    def names(self, slot: str) -> tuple[list[str], list[str], list[int]]:
        """(device names, host names, observed round indices) over every observed launch of ``slot``."""
        rec = self.seen.get(slot, [])
        return ([n for _, d, _ in rec for n in d], [n for _, _, h in rec for n in h], [r for r, _, _ in rec])
