"""Interpreter cases of a Triton port, run in one child process and read back as JSON lines.

TRITON_INTERPRET must be set before triton is imported, so a CPU test module runs its kernels in a
child: ``script`` gets this folder as ``sys.argv[1]`` (to import interp_fixups and its kin) and
prints one JSON object per case.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def run(script: str, timeout: float = 600) -> list[dict]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", script, str(TESTS)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
