"""Child-process entry point of ``skill-run check``: compile one recipe and write its facts as JSON.

Reads ``{"module", "shape", "config", "arch", "out"}`` from stdin. The parent has already set the
compile-only environment (``flydsl_env.child_env``). Any Python error is written to ``out`` as
``{"ok": false, "error": ...}``; an LLVM abort leaves no file and the parent reports the exit.
"""
from __future__ import annotations

import importlib
import json
import sys
import traceback


def main() -> int:
    req = json.loads(sys.stdin.read())
    out = req["out"]
    try:
        mod = importlib.import_module(req["module"])
        fn = getattr(mod, "compile_only", None)
        if fn is None:
            raise AttributeError(f"{req['module']} has no compile_only(shape, config, arch)")
        facts = fn(req["shape"], req["config"], req["arch"])
        payload = {"ok": True, "facts": facts}
    except Exception as exc:  # report, do not crash: the parent turns this into compile_failed
        payload = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    with open(out, "w") as fh:
        json.dump(payload, fh)
    return 0 if payload["ok"] else 1


if __name__ == "__main__":
    from skillrun.io import lifeline

    lifeline.die_with_parent()  # a compile must not outlive the `check` that asked for it
    sys.exit(main())
