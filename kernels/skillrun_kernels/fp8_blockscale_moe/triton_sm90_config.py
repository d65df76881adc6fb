"""The config schema of ``triton_sm90``'s recipes, beside the kernel rather than in it.

Kept out of the kernel module so that a schema edit does not change the kernel source's sha256
(which validation artifacts record). `skill-run lint` reads it without importing; the joint rules
(tiles dividing the dimensions, BLOCK_N1 a multiple of 128) are triton_sm90.check_config's.
"""
from __future__ import annotations

CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "BLOCK_M": {"type": "integer", "enum": [16, 32, 64, 128]},
        "BLOCK_N1": {"type": "integer", "enum": [128, 256]},
        "warps1": {"type": "integer", "enum": [4, 8]},
        "stages1": {"type": "integer", "minimum": 2, "maximum": 6},
        "BLOCK_N2": {"type": "integer", "enum": [32, 64, 128, 256]},
        "warps2": {"type": "integer", "enum": [4, 8]},
        "stages2": {"type": "integer", "minimum": 2, "maximum": 6},
    },
}
