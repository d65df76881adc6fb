"""Injectable timers for the physical-limit tests (``timer="defects.timers:instant"``)."""
from __future__ import annotations


class InstantTimer:
    """Claims every launch took one picosecond: a timer that missed the work."""

    method = "fake timer (tests): 1e-9 ms per launch"

    def measure(self, fn):
        fn()
        return lambda: 1e-9

    def sync(self):
        pass


def instant(device: str) -> InstantTimer:
    return InstantTimer()


class OverclaimTimer:
    """Claims every launch took 50 ms, whatever passed: a timer that is not a clock."""

    method = "fake timer (tests): 50 ms per launch"

    def measure(self, fn):
        fn()
        return lambda: 50.0

    def sync(self):
        pass


def overclaim(device: str) -> OverclaimTimer:
    return OverclaimTimer()
