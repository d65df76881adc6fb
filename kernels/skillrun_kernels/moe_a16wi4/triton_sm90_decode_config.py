"""The config schema of ``triton_sm90_decode`` (the issue-41 decode levers), beside the kernel so that
a schema edit never changes the kernel source's sha256 that artifacts record. `skill-run lint` reads it
without importing; the joint rules (tiles dividing the dimensions, BLOCK_K against the group size,
lever prerequisites) are ``triton_sm90_decode.check_config``'s."""
from __future__ import annotations

CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "BLOCK_M": {"type": "integer", "enum": [16, 32, 64]},
        "BLOCK_N1": {"type": "integer", "enum": [16, 32, 64, 128]},
        "BLOCK_K1": {"type": "integer", "enum": [32, 64, 128, 256]},
        "warps1": {"type": "integer", "enum": [4, 8]},
        "stages1": {"type": "integer", "minimum": 2, "maximum": 6},
        "BLOCK_N2": {"type": "integer", "enum": [16, 32, 64, 128, 256]},
        "BLOCK_K2": {"type": "integer", "enum": [32, 64, 128, 256]},
        "warps2": {"type": "integer", "enum": [4, 8]},
        "stages2": {"type": "integer", "minimum": 2, "maximum": 6},
        "wide_load": {"type": "boolean"},
        "int4_cvt": {"enum": ["magic", "lop3"]},
        "swap_ab": {"type": "boolean"},
        "scale_acc": {"type": "boolean"},
        "bias_acc": {"type": "boolean"},
        "split_k1": {"type": "integer", "minimum": 1, "maximum": 16},
        "persistent": {"type": "boolean"},
        "ctas_per_sm": {"type": "integer", "minimum": 1, "maximum": 16},
        "tile_order": {"enum": ["expert_major", "n_major"]},
        "route": {"enum": ["two", "one"]},
        "down": {"enum": ["atomic", "token"]},
        "fuse_down": {"type": "boolean"},
    },
}
