"""The config schema of ``triton_sm90``'s recipes, beside the kernel rather than in it.

Kept out of the kernel module on purpose: validation artifacts record the kernel source's sha256,
and a schema edit must not make a measured kernel look changed (stale) when its code is not.
"""
from __future__ import annotations

# What a recipe's config may hold: Config's fields (read without import by `skill-run lint`, which
# checks a card's `tunable:` space and `ablations:` against it; Config.check adds the joint rules).
CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "BM": {"type": "integer", "enum": [16, 32, 64, 128, 256]},
        "BN": {"type": "integer", "enum": [32, 64, 128, 256]},
        "NSUB": {"type": "integer", "enum": [1, 2]},
        "num_warps": {"type": "integer", "enum": [4, 8]},
        "stages": {"type": "integer", "minimum": 2, "maximum": 8},
        "persistent": {"type": "boolean"},
        "pair": {"type": "boolean"},
        "ws": {"type": "boolean"},
        "flatten": {"type": "boolean"},
        "tma": {"type": "boolean"},
        "diag_nopromote": {"type": "boolean"},
        "group_m": {"type": "integer", "minimum": 1, "maximum": 64},
        "split_k": {"type": "integer", "minimum": 1, "maximum": 16},
        "ctas_per_sm": {"type": "integer", "minimum": 1, "maximum": 4},
    },
}
