"""The config schema of ``flydsl_4wave``'s recipes, beside the kernel rather than in it.

Kept out of the kernel module on purpose: validation artifacts record the kernel source's sha256,
and a schema edit must not make a measured kernel look changed (stale) when its code is not.
"""
from __future__ import annotations

# What a recipe's config may hold: Config's fields (read without import by `skill-run lint`, which
# checks a card's `tunable:` space and `ablations:` against it).
CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "tile_m": {"type": "integer", "enum": [16, 32, 64, 128]},
        "tile_n": {"type": "integer", "enum": [64, 128, 256, 512]},
        "tile_k": {"type": "integer", "enum": [128, 256]},
        "waves_per_eu": {"type": "integer", "minimum": 0, "maximum": 8},
        "xcd_swizzle": {"type": "integer", "enum": [0, 1, 2, 4, 8]},
        "fused_promote": {"type": "boolean"},
        "debug_data_scale": {"type": "boolean"},
    },
}
