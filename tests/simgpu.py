"""A simulated GPU for testing the timing engine on the CPU (skillrun.execute.timing.Device).

Just enough physics to reproduce what biased the engine on the H200: work reaches the device only
after the host has spent its launch cost, the device runs queued work in order, and an event
recorded on an idle device fires at once. So a round that starts on an idle device charges the host's
launch latency to whichever slot goes first, unless the stream is held until the round is queued.
The SM clock can drop (throttling), which stretches kernels.
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

    def elapsed_time(self, other: "SimEvent") -> float:
        return (other.ts - self.ts) / 1e3


class SimGPU:
    def __init__(self, launch_us: float = 50.0, event_us: float = 2.0, clock_mhz: float = 1980.0) -> None:
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

    def sm_clock_mhz(self) -> float | None:
        return self.clock

    def host_us(self) -> float:
        return self.h

    def lead_in(self) -> None:
        self.lead_ins.append(self.h)
        self.enqueue(10.0, self.launch_us)

    # -- what the test's "kernels" and the harness's host work do
    def enqueue(self, dur_us: float, host_cost_us: float) -> float:
        self.h += host_cost_us
        start = max(self.free, self.h)
        self.free = start + dur_us
        return start

    def kernel(self, us_at_base_clock: float) -> None:
        self.kernels += 1
        self.enqueue(us_at_base_clock * self.base_clock / self.clock, self.launch_us)

    def host_work(self, us: float) -> None:
        self.h += us
