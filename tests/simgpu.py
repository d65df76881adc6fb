"""A simulated GPU for testing the timing engine on the CPU (skillrun.execute.timing.Device).

Just enough physics to reproduce what biased the engine on the H200: work reaches the device only
after the host has spent its launch cost, the device runs queued work in order, and an event
recorded on an idle device fires at once. So a round that starts on an idle device charges the host's
launch latency to whichever slot goes first, unless the stream is held until the round is queued.
The SM clock can drop (throttling), which stretches kernels. With ``power_window_us`` set, the clock
follows the device's recent load the way a power-limited GPU's does: boost when the window before a
kernel was mostly idle, the sustained clock when it was busy, and only the compute-bound part of a
kernel stretches with it (so two kernels' ratio depends on the power state, as on the H200).
With ``jitter`` each kernel's duration varies run to run (log-normal), so stopping rules and noise
floors have something to estimate.
"""
from __future__ import annotations


class SimEvent:
    def __init__(self, gpu: "SimGPU") -> None:
        self.gpu = gpu
        self.ts: float | None = None

    def record(self) -> None:
        self.ts = self.gpu.enqueue(0.0, self.gpu.event_us)

    def query(self) -> bool:
        return self.ts is not None and self.ts <= self.gpu.h

    def synchronize(self) -> None:
        if self.ts is not None:
            self.gpu.wait_until(self.ts)

    def elapsed_time(self, other: "SimEvent") -> float:
        return (other.ts - self.ts) / 1e3


class SimGPU:
    def __init__(self, launch_us: float = 50.0, event_us: float = 2.0, clock_mhz: float = 1980.0,
                 power_window_us: float | None = None, sustained_mhz: float = 1400.0, jitter: float = 0.0,
                 seed: int = 0) -> None:
        self.h = 0.0          # host clock, us
        self.free = 0.0       # when the device finishes what is queued, us
        self.launch_us = launch_us
        self.event_us = event_us
        self.base_clock = clock_mhz
        self.clock = clock_mhz
        self.kernels = 0
        self.spins = 0
        self.lead_ins: list[float] = []
        self.first_spin_us = 3000.0
        self.power_window_us = power_window_us
        self.sustained_mhz = sustained_mhz
        self.busy: list[tuple[float, float]] = []  # (start, end) of heavy work, for the power model
        self.clocks_seen: list[float] = []
        # Run-to-run variation of a kernel's duration: log-normal with this sigma (0: exact).
        import random

        self.jitter = jitter
        self._rng = random.Random(seed)

    # -- the Device protocol
    def event(self) -> SimEvent:
        return SimEvent(self)

    def spin(self, cycles: int) -> None:
        # The first launch of the spin kernel pays a module load on the device (seen on the H200:
        # a first short spin timed longer than a later long one).
        first = 0.0 if self.spins else self.first_spin_us
        self.spins += 1
        self.enqueue(cycles / self.clock + first, 5.0)

    def synchronize(self) -> None:
        self.h = max(self.h, self.free) + 1.0

    def wait_until(self, ts: float) -> None:
        self.h = max(self.h, ts)

    def sm_clock_mhz(self) -> float | None:
        if self.power_window_us:
            return self._power_clock(max(self.h, min(self.free, self.h)))
        return self.clock

    def _power_clock(self, t: float) -> float:
        """Boost after an idle window, the sustained clock after a busy one, linear between."""
        w = self.power_window_us
        lo = t - w
        busy = sum(max(0.0, min(e, t) - max(s, lo)) for s, e in self.busy if e > lo and s < t)
        frac = min(1.0, busy / w)
        return self.base_clock - (self.base_clock - self.sustained_mhz) * frac

    def host_us(self) -> float:
        return self.h

    def lead_in(self) -> None:
        self.lead_ins.append(self.h)
        start = self.enqueue(10.0, self.launch_us)
        self.busy.append((start, start + 10.0))

    # -- what the test's "kernels" and the harness's host work do
    def enqueue(self, dur_us: float, host_cost_us: float) -> float:
        self.h += host_cost_us
        start = max(self.free, self.h)
        self.free = start + dur_us
        return start

    def kernel(self, us_at_base_clock: float, compute: float = 1.0) -> None:
        """A kernel taking ``us_at_base_clock`` at the base clock; ``compute`` = the fraction of it
        that scales with the SM clock (the rest is memory time)."""
        self.kernels += 1
        if self.jitter:
            import math

            us_at_base_clock *= math.exp(self._rng.gauss(0.0, self.jitter))
        if not self.power_window_us:
            self.enqueue(us_at_base_clock * self.base_clock / self.clock, self.launch_us)
            return
        self.h += self.launch_us
        start = max(self.free, self.h)
        clock = self._power_clock(start)
        self.clocks_seen.append(clock)
        dur = us_at_base_clock * (compute * self.base_clock / clock + (1.0 - compute))
        self.free = start + dur
        self.busy.append((start, self.free))
        if len(self.busy) > 4096:
            self.busy = [(s, e) for s, e in self.busy if e > self.free - self.power_window_us]

    def host_work(self, us: float) -> None:
        self.h += us
