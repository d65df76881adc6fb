"""The config schema of ``triton_sm90``'s recipes, beside the kernel rather than in it.

Kept out of the kernel module on purpose: validation artifacts record the kernel source's sha256,
and a schema edit must not make a measured kernel look changed (stale) when its code is not.
"""
from __future__ import annotations

# What a recipe's config may hold (read without importing this module by `skill-run lint`, which
# checks every value of a card's `tunable:` space and `ablations:` against it).
CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "BLOCK_M": {"type": "integer", "enum": [16, 32, 64, 128, 256]},
        "BLOCK_N": {"type": "integer", "enum": [32, 64, 128, 256]},
        "BLOCK_K": {"type": "integer", "enum": [64, 128, 256, 512]},
        "GROUP_M": {"type": "integer", "minimum": 1, "maximum": 64},
        "num_warps": {"type": "integer", "enum": [4, 8]},
        "num_stages": {"type": "integer", "minimum": 2, "maximum": 6},
        "precise_acc": {"type": ["integer", "null"], "minimum": 1},
        "w_layout": {"enum": ["nk", "kn"]},
    },
}
