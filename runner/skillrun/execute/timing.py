"""The one timing engine: timers, held rounds, balanced slot positions, raw samples.

Used by the runner's session child (worker.py), the tuner (through the same session) and the
benchmarks in ``benchmarks/`` (``time_slots``). Rules it follows (../facts/measurement_method.md):

1. **No measured interval starts on an idle device.** Between rounds the harness synchronizes and
   does integrity work, so the device idles; a start event recorded on an idle device fires at once
   and the interval then holds the host's launch latency (seen on the H200: +50-60 us on whichever
   slot went first). Before a round's launches are queued, :class:`EventTimer` queues a device-side
   spin (``torch.cuda._sleep``, HIP alike) calibrated to outlast the host's queuing of the whole
   round, and checks that it did: the hold's end event must still be pending once the last launch is
   queued. A round the hold did not cover is flagged ``held: false``, kept out of the statistics, and
   the hold grows.
2. **Balanced positions.** Rounds come in blocks of one round per slot; a block draws a random order
   and rotates it, so every slot (the A/A copy too) takes every position exactly once per block.
   Statistics are taken over whole blocks, so no slot is favoured by where it sits.
3. **Raw samples are kept**: per slot the time, round, position and input set of every sample, per
   round the SM clock (where readable) and whether the hold covered it; ``position_effect`` reports
   per-position medians so a position effect is visible, not a silent shift.
   A launch that waits for the host inside itself (a count read back, a per-expert loop that
   synchronizes) ends any hold early, whatever its length, and the slots after it in the round then
   start on an idle device. After three unheld rounds in a row (each had grown the hold past what
   the round before needed), the timer holds every launch on its own (a spin before each start event): a
   launch that still finds its spin ended synchronized inside itself (its time includes that host
   round trip, which is its own cost); every other launch is measured off an idle device again.
   A slot seen doing so in two rounds gets no spin before its launches from then on: the host
   would only wait through it (on the H200's MoE shapes a spin grown to 200 ms before every launch
   of such a reference cost 26-44 s per shape). Its events then time the call as the device saw it,
   host round trips included, and the profiler's kernel durations (the second clock) say how much of
   that is kernel time; the artifact names the slot and the method (``hold.unspun``).
4. Rounds whose SM clock reads below 75 % of the session's median clock are dropped as throttled.
5. **Sustained load before each round.** A GPU's clock follows its recent power draw: single held
   launches after the harness's integrity gap ran at the H200's 1980 MHz boost, back-to-back replays
   at 1440-1680 MHz, and the port/cuBLAS ratio differed by up to 5 % between the two states. Serving
   runs GEMMs back to back, so before each timed round the engine queues ``sustain_ms`` of the round's
   own launches (untimed, other input sets) ahead of the hold: every round, in the runner and in the
   benchmarks alike, starts from the same loaded state, and the SM clock is read once the hold has
   ended, while the round's own launches run.

Devices are pluggable (``EventTimer(device=...)``) so the CPU tests drive this exact code with a
simulated GPU that has launch latency, idle gaps and clock throttling.
"""
from __future__ import annotations

import copy
import importlib
import math
import os
import random
import time
from typing import Any, Callable, ContextManager, Protocol

from skillrun.execute.stats import percentile

# A round's spin must outlast the host's queuing of the round by this factor, plus a fixed margin.
HOLD_FACTOR = 2.0
HOLD_MARGIN_US = 100.0
HOLD_START_US = 200.0
HOLD_MAX_US = 200_000.0
# nvbench drops samples below 75 % of the default SM clock. We take 75 % of the session's median
# clock: under sustained load a power-limited GPU settles well below its boost clock (the H200 at
# 1410-1700 MHz against a 1980 MHz boost), and 75 % of the highest clock seen then dropped ordinary
# loaded rounds as "throttled" (8 of 42 on 8192^3, commit fc67a32).
THROTTLE_FRACTION = 0.75
# Spin calibration: two lengths in SM cycles, and the range a real SM clock lies in (cycles per us).
CAL_SHORT, CAL_LONG = 100_000, 1_100_000
CAL_MIN, CAL_MAX = 100.0, 5000.0
# Untimed load queued before each timed round (module doc, rule 5); bounded in launches so a tiny
# slot cannot turn it into a host-bound loop. SKILLRUN_SUSTAIN_MS overrides it (0 turns it off).
SUSTAIN_MS = 50.0
SUSTAIN_MAX_LAUNCHES = 2048


def default_sustain_ms() -> float:
    raw = os.environ.get("SKILLRUN_SUSTAIN_MS")
    if raw is None:
        return SUSTAIN_MS
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"SKILLRUN_SUSTAIN_MS={raw!r} is not a number of milliseconds") from None
    if not (0.0 <= v <= 10_000.0):
        raise ValueError(f"SKILLRUN_SUSTAIN_MS={raw!r} is outside 0-10000 ms")
    return v


def sustain_repeats(sustain_ms: float, round_ms: float | None, launches_per_round: int) -> int:
    """How many times to replay a round's launches so the load lasts about ``sustain_ms``."""
    if sustain_ms <= 0 or not round_ms or round_ms <= 0 or not math.isfinite(round_ms):
        return 0
    cap = max(1, SUSTAIN_MAX_LAUNCHES // max(1, launches_per_round))
    return max(1, min(cap, math.ceil(sustain_ms / round_ms)))


class Timer(Protocol):
    method: str

    def begin_round(self, lead: bool = True, load: Callable[[], Any] | None = None) -> None: ...

    def measure(self, fn: Callable[[], Any]) -> Callable[[], float]: ...

    def end_round(self) -> dict[str, Any]: ...

    def sync(self) -> None: ...


class Device(Protocol):
    """What the event timer needs from a GPU (torch.cuda on CUDA and HIP; a simulation in tests)."""

    def event(self) -> Any: ...            # .record(), .query(), .elapsed_time(other) in ms

    def spin(self, cycles: int) -> None: ...  # a device-side busy wait of ``cycles`` SM clock cycles

    def synchronize(self) -> None: ...

    def sm_clock_mhz(self) -> float | None: ...

    def host_us(self) -> float: ...        # the host's clock, microseconds

    def lead_in(self) -> None: ...         # a short real kernel queued after the spin, before the first launch


class TorchDevice:
    """torch.cuda (CUDA and ROCm/HIP builds alike); the SM clock through NVML where it loads."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._lead = None
        self._nvml = None
        try:  # nvidia-ml-py: on NVIDIA only; on ROCm or without it the clock is simply not recorded
            import pynvml

            pynvml.nvmlInit()
            idx = torch.cuda.current_device()
            self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(idx))
        except Exception:
            self._nvml = None

    def event(self) -> Any:
        return self._torch.cuda.Event(enable_timing=True)

    def spin(self, cycles: int) -> None:
        self._torch.cuda._sleep(int(cycles))

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def sm_clock_mhz(self) -> float | None:
        if self._nvml is None:
            return None
        try:
            pynvml, h = self._nvml
            return float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
        except Exception:
            return None

    def host_us(self) -> float:
        return time.perf_counter() * 1e6

    def lead_in(self) -> None:
        # Memset of 64 MiB (about the H200's L2): ~15 us of ordinary memory work, and no slot's operands
        # left in L2. Without it the first launch of every round ran right after the one-SM spin and
        # measured ~6 us slower on the H200 (clocks and caches coming back from the spin).
        if self._lead is None:
            self._lead = self._torch.empty(64 << 20, dtype=self._torch.uint8, device="cuda")
        self._lead.zero_()


class EventTimer:
    """Device events around each launch; the stream is held by a calibrated spin until the round is queued."""

    takes_slot = True  # measure(fn, slot=...), begin_round(slot=...): the per-launch hold is decided per slot
    # A slot whose launch ended its own spin in this many rounds synchronizes inside itself.
    UNSPIN_AFTER = 2

    method = ("device events around each launch; each round queued behind a device-side spin that outlasts "
              "the host's queuing (checked per round), slot positions balanced")

    def __init__(self, device: Device | None = None, hold: bool = True, sustain_ms: float | None = None) -> None:
        self.dev = device or TorchDevice()
        self.hold = hold
        self.sustain_ms = default_sustain_ms() if sustain_ms is None else float(sustain_ms)
        self.hold_us = HOLD_START_US
        self.cycles_per_us: float | None = None
        self._round_t0 = 0.0
        self._hold_end = None
        self.rounds_unheld = 0
        self._unheld_streak = 0
        self.launch_hold = False     # hold each launch on its own (see the module doc, rule 1)
        self._launch_flags: list[tuple[str | None, bool | None]] = []
        self.unspun: set[str] = set()   # slots that synchronize inside their launch: no spin before them
        self._synced: dict[str, int] = {}
        self.calibration_note: str | None = None
        if not hold:
            self.method = "device events around each launch (no hold: an idle device adds launch latency)"

    def calibrate(self) -> float:
        """SM cycles per microsecond of the spin, measured with events.

        The first spin pays one-time costs (module load), so it is warmed up first; two lengths are
        timed three times each (min), so launch cost cancels in the difference. A result outside what
        any GPU clock can be (0.1-5 GHz) falls back to the SM clock NVML reads, else 1.5 GHz: a wrong
        calibration must never queue a spin of seconds."""
        if self.cycles_per_us is None:
            def timed(cycles: int) -> float:
                best = math.inf
                for _ in range(3):
                    self.dev.synchronize()
                    a, b = self.dev.event(), self.dev.event()
                    a.record()
                    self.dev.spin(cycles)
                    b.record()
                    self.dev.synchronize()
                    best = min(best, a.elapsed_time(b) * 1e3)
                return best

            timed(10_000)  # warm-up: the spin kernel's first launch
            short, long_ = timed(CAL_SHORT), timed(CAL_LONG)
            cpu = (CAL_LONG - CAL_SHORT) / (long_ - short) if long_ > short else math.nan
            if not (CAL_MIN <= cpu <= CAL_MAX):
                clock = self.dev.sm_clock_mhz()
                cpu = clock if clock and CAL_MIN <= clock <= CAL_MAX else 1500.0
                self.calibration_note = f"spin calibration unusable ({short:.1f} us / {long_:.1f} us); using {cpu:.0f} cycles/us"
            self.cycles_per_us = cpu
        return self.cycles_per_us

    def begin_round_observed(self, slot: str | None = None) -> None:
        """The hold for one launch under the profiler: no lead-in, whose memset kernel would show up in
        the profiled window as a kernel the slot did not launch (seen on the H200: FillFunctor)."""
        self.begin_round(lead=False, slot=slot)

    def begin_round(self, lead: bool = True, load: Callable[[], Any] | None = None, slot: str | None = None) -> None:
        """``slot``: a round of that one slot's launch (LaunchTimers); an unspun slot gets no hold."""
        self._hold_end = None
        if load is not None:
            # Queued first, so the device is busy with it while the host queues the hold and the
            # round; the hold then only has to cover the round's own queuing.
            load()
        if self.hold and not (slot is not None and self.launch_hold and slot in self.unspun):
            cpu = self.calibrate()
            self.dev.spin(int(min(self.hold_us, HOLD_MAX_US) * cpu))
            self._hold_end = self.dev.event()
            self._hold_end.record()
            lead_in = getattr(self.dev, "lead_in", None)
            if lead and lead_in is not None:
                lead_in()
        self._round_t0 = self.dev.host_us()

    def measure(self, fn: Callable[[], Any], slot: str | None = None) -> Callable[[], float]:
        start, end = self.dev.event(), self.dev.event()
        mark = None
        spin = self.hold and self.launch_hold and slot not in self.unspun
        if spin:
            self.dev.spin(int(min(self.hold_us, HOLD_MAX_US) * self.calibrate()))
            mark = self.dev.event()
            mark.record()
        start.record()
        fn()
        end.record()
        if mark is not None:
            # Still spinning once this launch is queued: it met no idle device. Ended: it waited for
            # the host inside itself (its own cost), or the spin was short (it grows below).
            self._launch_flags.append((slot, not bool(mark.query())))
        elif self.hold and self.launch_hold:
            self._launch_flags.append((slot, None))  # a known synchronizing slot: not held, by design
        return lambda: float(start.elapsed_time(end))

    def end_round(self) -> dict[str, Any]:
        queued_us = self.dev.host_us() - self._round_t0
        held = None
        flags, self._launch_flags = self._launch_flags, []
        extra: dict[str, Any] = {}
        if self.launch_hold and flags:
            # Judged per launch: a launch that ended its own spin synchronized inside itself (reported,
            # its time is its own); a slot seen doing so UNSPIN_AFTER times gets no spin from then on.
            # When most of the other launches of a round ended theirs, the spin is simply too short for
            # one launch's queuing, and it grows.
            for slot, ok in flags:
                if ok is False and slot is not None:
                    self._synced[slot] = self._synced.get(slot, 0) + 1
                    if self._synced[slot] >= self.UNSPIN_AFTER:
                        self.unspun.add(slot)
            judged = [ok for slot, ok in flags if ok is not None and slot not in self.unspun]
            if judged and sum(1 for ok in judged if not ok) > len(judged) / 2:
                self.hold_us = min(HOLD_MAX_US, 2 * self.hold_us)
            held, extra = True, {"launch_held": [ok for _, ok in flags]}
        elif self._hold_end is not None:
            # Still spinning now that every launch is queued: no launch of this round met an idle device.
            held = not bool(self._hold_end.query())
            want = HOLD_FACTOR * queued_us + HOLD_MARGIN_US
            if not held:
                self.rounds_unheld += 1
                # Each unheld round grows the hold past what that round's queuing needed, so three in a
                # row mean a launch synchronizes inside itself (the host's queuing then includes the
                # wait for the device, spin and all, and no hold can outlast it).
                self._unheld_streak += 1
                if self._unheld_streak >= 3:
                    self.launch_hold = True
                    self.hold_us = HOLD_START_US
                else:
                    self.hold_us = min(HOLD_MAX_US, max(2 * self.hold_us, want))
            else:
                self._unheld_streak = 0
                if want > self.hold_us:
                    self.hold_us = min(HOLD_MAX_US, want)
        # Read while the round's own kernels run: once the hold has ended (before it, the clock read is
        # the load's), and before the synchronize (an idle device reports its boost clock).
        if self._hold_end is not None and hasattr(self._hold_end, "synchronize"):
            self._hold_end.synchronize()
        clock = self.dev.sm_clock_mhz()
        self.dev.synchronize()
        return {"held": held, "queue_us": queued_us, "clock_mhz": clock, **extra}

    def sync(self) -> None:
        self.dev.synchronize()


class LaunchTimers:
    """Each launch a round of its own, behind its own hold: how a session's slot process times the launches
    the parent asks for one at a time (slot_server.py; the parent runs :func:`interleave` over them).

    One timer per slot (``make()`` builds it; calibrations are shared): a slot's hold, how long it has grown
    and whether the slot synchronizes inside its launch are its own. A process serving several slots with one
    timer let a reference that reads counts back on the host (an eager MoE loop) grow the hold before every
    launch of every slot it served towards the 200 ms cap, and the host waited through each; here that slot
    alone goes through the engine's steps (unheld launches, then held on its own, then, seen synchronizing
    ``EventTimer.UNSPIN_AFTER`` times, no spin at all: ``unspun``), and the others keep their short holds."""

    def __init__(self, make: Callable[[], Timer]) -> None:
        self.make = make
        self.timers: dict[str, Timer] = {}

    @classmethod
    def like(cls, proto: Timer) -> "LaunchTimers":
        """Timers like ``proto`` (make_timer's): event timers share its device (one NVML handle, one lead-in
        buffer) and its settings; any other timer is built again by its own class."""
        if isinstance(proto, EventTimer):
            return cls(lambda: EventTimer(device=proto.dev, hold=proto.hold, sustain_ms=proto.sustain_ms))
        return cls(lambda: copy.copy(proto))

    def timer(self, slot: str) -> Timer:
        t = self.timers.get(slot)
        if t is None:
            known = next((o for o in self.timers.values() if getattr(o, "cycles_per_us", None)), None)
            t = self.timers[slot] = self.make()
            if known is not None and getattr(t, "cycles_per_us", 0) is None:
                t.cycles_per_us, t.calibration_note = known.cycles_per_us, known.calibration_note  # type: ignore[attr-defined]
        return t

    def launch(self, slot: str, fn: Callable[[], Any], observe: ContextManager[Any] | None = None) -> tuple[float, dict[str, Any]]:
        """One timed launch of ``slot`` (inside ``observe``, the profiler, when given): (ms, what the round's end
        said, plus ``self_synced``, ``unspun``, ``launch_hold`` and ``hold_us`` of this slot's timer)."""
        timer = self.timer(slot)
        per_slot = getattr(timer, "takes_slot", False)
        kw = {"slot": slot} if per_slot else {}
        begin = getattr(timer, "begin_round", None)
        end = getattr(timer, "end_round", None)
        info: dict[str, Any] = {}
        if observe is not None:
            with observe:
                if begin is not None:
                    getattr(timer, "begin_round_observed", begin)(**kw)
                read = timer.measure(fn, **kw)
                if end is not None:
                    info = end()
        else:
            if begin is not None:
                begin(**kw)
            read = timer.measure(fn, **kw)
            info = end() if end is not None else {}
            if end is None:
                timer.sync()
        ms = float(read())
        flags = info.get("launch_held") or []
        unspun = slot in (getattr(timer, "unspun", None) or ())
        return ms, {**info, "self_synced": unspun or (bool(flags) and flags[0] is False), "unspun": unspun,
                    "launch_hold": bool(getattr(timer, "launch_hold", False)), "hold_us": getattr(timer, "hold_us", None)}


class WallTimer:
    """Host perf_counter around a synchronous launch: CPU only, never GPU evidence."""

    method = "host wall clock (time.perf_counter) around each launch, CPU"

    sustain_ms = 0.0  # a CPU has no power state worth matching

    def __init__(self, synchronize: Callable[[], None] | None = None) -> None:
        self._sync = synchronize or (lambda: None)

    def begin_round(self, lead: bool = True, load: Callable[[], Any] | None = None) -> None:
        pass

    def measure(self, fn: Callable[[], Any]) -> Callable[[], float]:
        t0 = time.perf_counter()
        fn()
        self._sync()
        ms = (time.perf_counter() - t0) * 1e3
        return lambda: ms

    def end_round(self) -> dict[str, Any]:
        self._sync()
        return {"held": None, "queue_us": None, "clock_mhz": None}

    def sync(self) -> None:
        self._sync()


def make_timer(spec: str | None, device: str) -> Timer | None:
    if spec is None:
        return None
    if spec == "event":
        return EventTimer()
    if spec == "event-nohold":  # only to show the idle-device bias next to the held timer (benchmarks)
        return EventTimer(hold=False)
    if spec == "wall":
        if device.startswith("cuda"):
            import torch

            return WallTimer(torch.cuda.synchronize)
        return WallTimer()
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"timer {spec!r} is not 'event', 'wall' or 'module:factory'")
    return getattr(importlib.import_module(module), attr)(device)


def rotation_sets(bytes_per_set: int, l2_bytes: int | None, mode: str, max_sets: int, mem_budget: int) -> tuple[int, str]:
    """How many input sets to rotate so each launch reads operands that are not in L2."""
    if mode == "off" or not l2_bytes:
        return 1, "off (warm L2)" if mode == "off" else "off (device L2 size unknown)"
    if mode == "flush":
        return 1, f"flush: {2 * l2_bytes} bytes written between launches (2x L2)"
    need = math.ceil(2 * l2_bytes / max(bytes_per_set, 1)) + 1
    n = max(1, min(need, max_sets, mem_budget // max(bytes_per_set, 1)))
    if n < need:
        return n, f"rotate {n} input sets x {bytes_per_set} bytes (wanted {need} to cover 2x L2 = {2 * l2_bytes} bytes; capped by memory)"
    return n, f"rotate {n} input sets x {bytes_per_set} bytes >= 2x L2 ({2 * l2_bytes} bytes)"


def balanced_orders(names: list[str], rng: random.Random):
    """Round orders in blocks of len(names): a random order per block, rotated once per round.

    Within a block every slot takes every position exactly once (a cyclic Latin square), and the
    random base order keeps any slot from always following the same neighbour."""
    n = len(names)
    while True:
        base = list(names)
        rng.shuffle(base)
        for k in range(n):
            yield base[k:] + base[:k]


def position_effect(raw: dict[str, dict[str, list]]) -> dict[str, Any]:
    """Per slot, the median at each position; the largest relative spread between positions."""
    per: dict[str, list[float | None]] = {}
    worst, worst_slot = 0.0, None
    for slot, cols in raw.items():
        by: dict[int, list[float]] = {}
        for ms, pos, kept in zip(cols["ms"], cols["position"], cols["kept"]):
            if kept:
                by.setdefault(pos, []).append(ms)
        if not by:
            continue
        npos = max(by) + 1
        meds = [percentile(by[p], 50) if p in by else None for p in range(npos)]
        per[slot] = [round(m, 6) if m is not None else None for m in meds]
        vals = [m for m in meds if m is not None]
        allv = [x for p in by.values() for x in p]
        if len(vals) >= 2 and allv:
            eff = 100.0 * (max(vals) - min(vals)) / percentile(allv, 50)
            if eff > worst:
                worst, worst_slot = eff, slot
    return {"median_ms_by_position": per, "max_pct": round(worst, 3), "slot": worst_slot}


def interleave(slots: dict[str, list[Callable[[], Any]]], timer: Timer, rounds: int, warmup: int,
               between: Callable[[], None] | None = None, max_seconds: float | None = None, *,
               observe: int = 0, observer: Callable[[str], ContextManager[Any]] | None = None,
               after_round: Callable[[dict[str, Any]], None] | None = None,
               rng: random.Random | None = None, stop: Callable[..., bool] | None = None,
               horizon: int | None = None) -> dict[str, Any]:
    """Time every slot once per round, positions balanced, each round held (see the module doc).

    ``slots`` maps a slot name to one launch callable per input set (every slot the same number);
    round ``g`` (warm-up included) launches set ``g % sets`` in every slot, so consecutive launches
    read different operands (cold L2). Warm-up rounds run the same pattern untimed. ``rounds`` is
    rounded up to whole blocks (one round per slot) so positions stay balanced.

    ``observe`` extra rounds, at positions drawn from ``rng`` among the timed ones, run each slot's
    launch inside ``observer(slot)`` (the profiler, see integrity.RoundObserver). Their times go to
    ``observed``, never into ``samples``: the profiler's cost cannot reach the statistics, and a port
    cannot tell from the call count which launches are observed.

    ``after_round(info)`` runs after every round, once the round's launches are finished
    (``timer.end_round``) and their times read, so whatever it does (checksums, output checks, new
    input content) lies outside every measured interval. ``info``: ``set`` (index), ``kind``
    (warmup | timed | observed), ``index`` (timed/observed rounds, counted together), ``last``.

    ``stop(raw, rounds, block, seconds)`` (confidence.StopRule), when given, is asked after every whole
    block of timed rounds and ends the session early when it returns True (``rounds`` is then a cap);
    ``horizon`` is the number of timed rounds the observed rounds are drawn over (the rule's minimum,
    so a session that stops there has had all of them; default: every round).

    Returns ``samples`` (kept ms per slot: held, not throttled, not observed), ``raw`` (every timed
    sample with round, position, set and whether it was kept), ``round_info`` (per timed round: held,
    clock, host queuing time), ``observed`` (ms per slot in observed rounds) and ``observed_positions``,
    ``position_effect``, and the counts.
    """
    names = list(slots)
    sizes = {len(v) for v in slots.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every slot needs the same, non-zero number of input sets (got {sorted(sizes)})")
    n_sets = sizes.pop()
    rng = rng or random.SystemRandom()
    block = len(names)
    rounds = max(block, math.ceil(max(1, rounds) / block) * block)
    total = rounds + max(0, observe)
    # Which rounds are observed is drawn when each round starts (selection sampling: a uniform random
    # subset of ``observe`` rounds), never as a schedule a port could read from this frame in advance.
    to_observe = max(0, min(observe, total)) if observer is not None else 0
    g = 0  # rounds run so far, warm-up included
    begin = getattr(timer, "begin_round", lambda **_: None)
    begin_observed = getattr(timer, "begin_round_observed", begin)
    end = getattr(timer, "end_round", None)

    span = (min(rounds, max(block, int(horizon))) if horizon else rounds) + max(0, observe)  # observed rounds drawn over it
    timed = ((lambda fn, n: timer.measure(fn, slot=n)) if getattr(timer, "takes_slot", False)
             else (lambda fn, n: timer.measure(fn)))
    sustain_ms = float(getattr(timer, "sustain_ms", 0.0) or 0.0)
    est = {"round_ms": None, "load_ms": 0.0}  # one round's device time (last timed round, else warm-up wall)

    def one_round(order: list[str], wrap: Callable[[str], ContextManager[Any]] | None, measure: bool):
        j = g % n_sets
        pending = []
        if measure and wrap is None:
            k = sustain_repeats(sustain_ms, est["round_ms"], len(order))
            est["load_ms"] = k * (est["round_ms"] or 0.0)
            if k:
                def load() -> None:
                    # The round's own launches on the other input sets: the same kernels, the same
                    # power draw, no operand left in L2 for the round (the lead-in flushes it too).
                    for r in range(k):
                        for n in order:
                            slots[n][(j + 1 + r) % n_sets]()
                begin(load=load)
            else:
                begin()
        for n in order:
            if between:
                between()
            fn = slots[n][j]
            if not measure:
                fn()
            elif wrap is None:
                pending.append((n, timed(fn, n)))
            else:
                # Observed: each launch gets its own profiler session, whose start and stop synchronize
                # the device; the launch is held on its own so the profiler's host cost stays outside it
                # (observed and plain times then compare like for like, see the observer-effect check).
                with wrap(n):
                    begin_observed()
                    pending.append((n, timed(fn, n)))
                    if end is not None:
                        end()
        if measure and end is not None and wrap is None:
            info = end()
        else:
            timer.sync()
            info = {"held": None, "queue_us": None, "clock_mhz": None}
        return pending, info

    orders = balanced_orders(names, rng)
    # Where the session's time goes (cost.py): warm-up, timed rounds, and the checks (after_round's
    # work and the profiled rounds). The stop rule's seconds are the timer's own clock where it has
    # one (a simulated device's), so its caps mean the same there.
    spent = {"warmup": 0.0, "rounds": 0.0, "checks": 0.0}
    user_after = after_round
    if user_after is not None:
        def after_round(info: dict[str, Any]) -> None:
            a0 = time.perf_counter()
            try:
                user_after(info)
            finally:
                spent["checks"] += time.perf_counter() - a0
    dev = getattr(timer, "dev", None)
    now = (lambda: dev.host_us() / 1e6) if hasattr(dev, "host_us") else time.perf_counter  # noqa: E731
    w_start = time.perf_counter()
    for w in range(warmup):
        w0 = now()
        one_round(names, None, False)  # ends in a synchronize: its wall time bounds one round's device time
        est["round_ms"] = (now() - w0) * 1e3
        if after_round:
            after_round({"set": g % n_sets, "kind": "warmup", "index": w, "last": False})
        g += 1
    timer.sync()
    spent["warmup"] = time.perf_counter() - w_start - spent["checks"]
    checks_before = spent["checks"]
    raw: dict[str, dict[str, list]] = {n: {"ms": [], "round": [], "position": [], "set": [], "kept": []} for n in names}
    observed: dict[str, list[float]] = {n: [] for n in names}
    observed_pos: dict[str, list[int]] = {n: [] for n in names}
    round_info: dict[str, list] = {"held": [], "clock_mhz": [], "queue_us": [], "load_ms": []}
    self_sync: dict[str, int] = {}
    t0 = time.perf_counter()
    d0 = now()
    done, seen = 0, []
    timed_index = 0
    force_next = False
    stopped = False
    for i in range(total):
        need = to_observe - len(seen)
        obs = need > 0 and (force_next or rng.random() * max(1, span - i) < need)
        # Observed rounds take their order from the same stream but do not consume a block slot:
        # the timed rounds alone keep the Latin square whole.
        order = next(orders) if not obs else rng.sample(names, len(names))
        if obs and hasattr(observer, "round"):
            observer.round = i  # type: ignore[union-attr]
        r0 = time.perf_counter()
        pending, info = one_round(order, observer if obs else None, True)
        if obs:  # a profiled round is a check, not a sample
            spent["checks"] += time.perf_counter() - r0
        if obs:
            for pos, (n, read) in enumerate(pending):
                observed[n].append(read())
                observed_pos[n].append(pos)
            seen.append(i)
        else:
            lh = info.get("launch_held")
            if lh and len(lh) == len(pending):
                for (n, _), ok in zip(pending, lh):
                    if not ok:
                        self_sync[n] = self_sync.get(n, 0) + 1
            for pos, (n, read) in enumerate(pending):
                r = raw[n]
                r["ms"].append(read())
                r["round"].append(timed_index)
                r["position"].append(pos)
                r["set"].append(g % n_sets)
                r["kept"].append(info.get("held") is not False)
            info["load_ms"] = est["load_ms"]
            est["round_ms"] = sum(raw[n]["ms"][-1] for n in names)
            for k in round_info:
                v = info.get(k)
                round_info[k].append(round(v, 2) if isinstance(v, float) and k != "held" else v)
            timed_index += 1
            done += 1
        over = (max_seconds is not None and time.perf_counter() - t0 > max_seconds and done >= 2 * block
                and done % block == 0)
        if not over and stop is not None and not obs and done % block == 0 and not stopped:
            # A whole block is in: is the ratio known well enough (confidence.StopRule)?
            stopped = bool(stop(raw, done, block, now() - d0))
        over = over or stopped
        last = i == total - 1 or (over and (seen or not to_observe))
        if after_round:
            after_round({"set": g % n_sets, "kind": "observed" if obs else "timed", "index": i, "last": last})
        g += 1
        if last:
            break
        if over:  # out of time, but no round was observed yet: observe the next one, then stop
            force_next = True
    spent["rounds"] = max(0.0, time.perf_counter() - t0 - (spent["checks"] - checks_before))
    unheld = sum(1 for h in round_info["held"] if h is False)
    judged = sum(1 for h in round_info["held"] if h is not None)
    hold_ineffective = bool(judged) and unheld > judged / 2
    if hold_ineffective:
        # A launch that waits for the host inside itself (a .item(), a routing count read back, a
        # per-expert Python loop that synchronizes) ends the hold early whatever its length, so most
        # rounds read "unheld". Dropping them would drop the slot; keep them and say so instead.
        for cols in raw.values():
            cols["kept"] = [True] * len(cols["kept"])
    _drop_throttled(raw, round_info)
    samples = {n: [ms for ms, k in zip(raw[n]["ms"], raw[n]["kept"]) if k] for n in names}
    return {"samples": samples, "rounds": done, "warmup": warmup, "observed": observed,
            "observed_positions": observed_pos, "observed_rounds": seen, "raw": raw, "round_info": round_info,
            "unheld_rounds": unheld, "hold_ineffective": hold_ineffective, "throttled_rounds": sum(1 for x in round_info.get("throttled", []) if x),
            "position_effect": position_effect(raw), "block": block,
            "held": bool(getattr(timer, "hold", False)), "hold_us": getattr(timer, "hold_us", None),
            "sustain_ms": sustain_ms, "launch_hold": bool(getattr(timer, "launch_hold", False)),
            "self_syncing": self_sync, "unspun": sorted(getattr(timer, "unspun", ()) or ()), "stopped_early": stopped,
            "phase_s": {k: round(v, 4) for k, v in spent.items()}, "timed_device_s": round(now() - d0, 4)}


def _drop_throttled(raw: dict[str, dict[str, list]], round_info: dict[str, list]) -> None:
    clocks = [c for c in round_info["clock_mhz"] if isinstance(c, (int, float)) and c > 0]
    if not clocks:
        round_info["throttled"] = [False] * len(round_info["held"])
        return
    floor = THROTTLE_FRACTION * percentile(clocks, 50)
    thr = [isinstance(c, (int, float)) and 0 < c < floor for c in round_info["clock_mhz"]]
    round_info["throttled"] = thr
    for cols in raw.values():
        cols["kept"] = [k and not thr[r] for k, r in zip(cols["kept"], cols["round"])]


def time_slots(fns: dict[str, Callable[[], Any]] | dict[str, list[Callable[[], Any]]], rounds: int = 20, warmup: int = 2,
               timer: Timer | None = None, between: Callable[[], None] | None = None,
               max_seconds: float | None = None, rng: random.Random | None = None) -> dict[str, Any]:
    """The benchmarks' entry point: the same engine without the harness's integrity work.

    ``fns`` maps a name to one callable (or one per input set). Returns :func:`interleave`'s result
    plus ``median_ms`` per slot."""
    slots = {k: (v if isinstance(v, list) else [v]) for k, v in fns.items()}
    n = max(len(v) for v in slots.values())
    slots = {k: (v * n if len(v) == 1 else v) for k, v in slots.items()}
    t = interleave(slots, timer or EventTimer(), rounds, warmup, between, max_seconds, rng=rng)
    t["median_ms"] = {k: (percentile(v, 50) if v else math.nan) for k, v in t["samples"].items()}
    t["method"] = getattr(timer, "method", EventTimer.method) if timer is not None else EventTimer.method
    return t
