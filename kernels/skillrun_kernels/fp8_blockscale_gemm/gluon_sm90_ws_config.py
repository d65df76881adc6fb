"""The config schema of ``gluon_sm90_ws`` (the Gluon kernel with DeepGEMM's levers as knobs), beside it.

Kept out of the kernel module for the same reason as ``gluon_sm90_config.py``: artifacts record the
kernel source's sha256, and a schema edit must not make a measured kernel look changed. Only the
knobs ``gluon_sm90_ws.Config`` has; ``Config.check`` adds the joint rules (register budget,
shared memory, which consumer can honour a knob), which a tuner candidate breaking them hits as a
build error recorded with its reason, and ``gluon_sm90_ws.prune`` drops, on a CPU, the configs whose
compiled code spills or has its wgmma serialised by ptxas.
"""
from __future__ import annotations

# Read without import by `skill-run lint` (a literal).
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
        "cluster_m": {"type": "integer", "enum": [1, 2]},
        "persistent": {"type": "boolean"},
        "epilogue_overlap": {"type": "boolean"},
        "promote_k": {"type": "integer", "enum": [64, 128]},
    },
}
