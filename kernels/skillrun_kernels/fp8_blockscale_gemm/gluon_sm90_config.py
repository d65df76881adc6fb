"""The config schema of ``gluon_sm90`` (the warp-specialized Gluon kernel), beside the kernel.

Kept out of the kernel module for the same reason as ``triton_sm90_config.py``: artifacts record
the kernel source's sha256, and a schema edit must not make a measured kernel look changed.
Only knobs ``gluon_sm90.Config`` really has; ``Config.check`` adds the joint rules (register budget
of BN 256 with async depth 1, shared memory per stage count, ...), which a tuner candidate that
breaks them hits as a build error, recorded with its reason.
"""
from __future__ import annotations

# Read without import by `skill-run lint` (a literal), which checks every `tunable_kernels` space
# naming gluon_sm90 against it.
CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "BN": {"type": "integer", "enum": [64, 128, 256]},
        "consumers": {"type": "integer", "enum": [1, 2]},
        "stages": {"type": "integer", "minimum": 2, "maximum": 8},
        "async_depth": {"type": "integer", "enum": [0, 1]},
        "group_m": {"type": "integer", "minimum": 1, "maximum": 64},
        "promote": {"type": "boolean"},
        "consumer_regs": {"type": "integer", "minimum": 0, "maximum": 256, "multipleOf": 8},
        "ctas_per_sm": {"type": "integer", "enum": [1]},
        "a_scales": {"type": "string", "enum": ["tma", "global"]},
    },
}
