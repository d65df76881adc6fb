"""The config schema of ``triton_sm90``'s recipes, beside the kernel rather than in it.

Kept out of the kernel module on purpose: validation artifacts record the kernel source's sha256,
and a schema edit must not make a measured kernel look changed (stale) when its code is not.
"""
from __future__ import annotations

# What a recipe's config may hold (read without import by `skill-run lint`, which checks a card's
# `tunable:` space and `ablations:` against it; triton_sm90.check_config adds the joint rules:
# tiles dividing the dimensions, BLOCK_K vs the group size, split_k1 within the K steps).
CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "BLOCK_M": {"type": "integer", "enum": [16, 32, 64, 128]},
        "BLOCK_N1": {"type": "integer", "enum": [16, 32, 64, 128, 256]},
        "BLOCK_K1": {"type": "integer", "enum": [32, 64, 128, 256, 512]},
        "warps1": {"type": "integer", "enum": [4, 8]},
        "stages1": {"type": "integer", "minimum": 2, "maximum": 6},
        "split1": {"type": "boolean"},
        "BLOCK_N2": {"type": "integer", "enum": [16, 32, 64, 128, 256]},
        "BLOCK_K2": {"type": "integer", "enum": [32, 64, 128, 256, 512]},
        "warps2": {"type": "integer", "enum": [4, 8]},
        "stages2": {"type": "integer", "minimum": 2, "maximum": 6},
        "split2": {"type": "boolean"},
        "scale_acc": {"type": "boolean"},
        "split_k1": {"type": "integer", "minimum": 1, "maximum": 32},
        "int4_cvt": {"enum": ["i2f", "magic"]},
    },
}
