"""The output commitment's bytes from a device: copied into a reused page-locked buffer (the H200 run spent
~465 ms of every launch request of a 512 MiB output on a fresh pageable copy and its hash). The digest must be
the same bytes-for-bytes commitment whichever path the bytes took. The device is simulated: a tensor whose
``device.type`` is not cpu, and an allocator that stands in for pinned memory."""
from __future__ import annotations

import torch

from skillrun.execute import integrity


class _DeviceU8:
    """A flat uint8 tensor 'on a device': what host_bytes reads (device, numel) and copies from."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t, self.device = t, torch.device("meta")

    def numel(self) -> int:
        return self.t.numel()

    def cpu(self) -> torch.Tensor:
        return self.t.clone()


def _alloc(made: list):
    def alloc(n: int) -> torch.Tensor:
        b = torch.empty(n, dtype=torch.uint8)
        made.append(b)
        return b
    return alloc


def test_device_bytes_go_through_one_reused_buffer_and_hash_the_same(monkeypatch):
    monkeypatch.setattr(integrity, "_HOST_BUFFERS", {})
    made: list = []
    x = torch.arange(3 * 1024, dtype=torch.float32).reshape(3, 1024)
    u8 = x.reshape(-1).view(torch.uint8)
    want = integrity.bytes_digest(u8.numpy(), "float32", [3, 1024])
    orig_copy = torch.Tensor.copy_

    def copy_(self, src, *a, **k):  # the pinned buffer's copy from the simulated device
        return orig_copy(self, src.t if isinstance(src, _DeviceU8) else src, *a, **k)

    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    for _ in range(3):
        got = integrity.bytes_digest(integrity.host_bytes(_DeviceU8(u8), alloc=_alloc(made)), "float32", [3, 1024])
        assert got == want
    assert len(made) == 1  # one buffer for the size, reused by every launch


def test_the_buffers_are_bounded_and_a_failed_pin_falls_back_to_a_plain_copy(monkeypatch):
    monkeypatch.setattr(integrity, "_HOST_BUFFERS", {})
    made: list = []
    orig_copy = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_",
                        lambda self, src, *a, **k: orig_copy(self, src.t if isinstance(src, _DeviceU8) else src, *a, **k))
    for n in (16, 32, 48, 64, 80):
        integrity.host_bytes(_DeviceU8(torch.zeros(n, dtype=torch.uint8)), alloc=_alloc(made))
    assert sorted(integrity._HOST_BUFFERS) == [48, 64, 80]  # the most recent _HOST_KEEP sizes

    def refuse(n):
        raise RuntimeError("cannot pin: RLIMIT_MEMLOCK")

    data = integrity.host_bytes(_DeviceU8(torch.full((7,), 5, dtype=torch.uint8)), alloc=refuse)
    assert bytes(data) == b"\x05" * 7 and 7 not in integrity._HOST_BUFFERS
