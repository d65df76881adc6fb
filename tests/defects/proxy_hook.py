"""A kernel module that tries to choose its own CPU proxy shape (a 16x16x16 problem proves
little, and a shape picked by the port can be one where it happens to be right). The runner must
ignore the hook: the proxy is the runner's choice from the card's planned shape (proxy.py)."""
from __future__ import annotations

from defects.kernels import build_port_ok

HOOK_SHAPE = {"M": 16, "N": 16, "K": 16}


def cpu_proxy_shape(shape: dict, config: dict) -> dict:
    return dict(HOOK_SHAPE)


def proxy_shape(shape: dict) -> dict:  # the name the problem-module hook used to have
    return dict(HOOK_SHAPE)


def build(shape: dict, config: dict, device: str):
    return build_port_ok(shape, config, device)
