"""Which Landlock rule does a GPU driver need? (issue 39's H200 run: CUDA init fails with error 304 under the
sandbox's Landlock domain, with or without the namespaces.) Each variant runs in its own child: a Landlock
domain like sandbox.enter's (no namespaces), with one grant added, then a CUDA context, pinned memory, a
cuBLAS call and a synchronize. Prints one JSON line per variant and the machine's facts around them.

    PYTHONPATH=runner:kernels python3 benchmarks/sandbox_landlock_probe.py
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import tempfile

VARIANTS = {
    "as_enter": {},
    "shm_writable": {"own": ["/dev/shm"]},
    "tmp_writable": {"own": ["/tmp"]},
    "run_var_readable": {"read": ["/run", "/var"]},
    "root_readable": {"read": ["/"]},
    "root_readable_shm_tmp": {"read": ["/"], "own": ["/dev/shm", "/tmp"]},
    "dev_all_rights": {"dev_all": True},
    "no_new_privs_off": {"nnp": False},
    "root_all_rights": {"read": ["/"], "own": ["/"], "dev_all": True},
    # After the first H200 answer (only root_all_rights worked, root_readable_shm_tmp and dev_all_rights did not):
    # which write outside /dev, /dev/shm and /tmp the driver makes
    "proc_writable": {"read": ["/"], "own": ["/proc"]},
    "sys_writable": {"read": ["/"], "own": ["/sys"]},
    "home_writable": {"read": ["/"], "own": [os.path.expanduser("~")]},
    "proc_sys_dev_writable": {"read": ["/"], "own": ["/proc", "/sys", "/dev"]},
}


def child(name: str, folder: str) -> dict:
    from skillrun.io import sandbox as sb

    v = VARIANTS[name]
    libc = sb._libc()
    abi = sb.landlock_abi()
    read = sb._readable() + v.get("read", [])
    own = [folder] + v.get("own", [])
    handled = sb._handled(abi)
    if not v.get("nnp", True):
        base, real = libc, libc.prctl

        class _L:  # the same libc, with PR_SET_NO_NEW_PRIVS skipped (root may restrict itself without it)
            def __getattr__(self, k):
                return getattr(base, k)

            def prctl(self, opt, *a):
                return 0 if opt == sb._PR_SET_NO_NEW_PRIVS else real(opt, *a)

        libc = _L()
    devices = ["/dev"]
    if v.get("dev_all"):
        own = own + ["/dev"]
    sb._landlock(libc, abi, read, own, devices)
    try:
        import torch

        x = torch.ones(256, 256, device="cuda")
        p = torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
        y = float((x @ x).sum())
        torch.cuda.synchronize()
        return {"variant": name, "ok": y == 256.0 ** 3 and p.is_pinned()}
    except BaseException as exc:  # noqa: BLE001
        return {"variant": name, "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def main() -> int:
    facts = {}
    for cmd in ("ls -la /dev/shm | head -5", "ls -la /dev | grep -i nvidia", "ls /proc/driver/nvidia 2>&1 | head",
                "which nvidia-modprobe nvidia-smi 2>&1", "id", "mount | grep -E ' /proc | /dev/shm | /dev ' | head",
                "cat /proc/self/status | grep -E 'Cap|Seccomp|NoNewPrivs'", "uname -r"):
        facts[cmd] = subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()[:800]
    print(json.dumps({"facts": facts}, indent=1), flush=True)
    with tempfile.TemporaryDirectory() as d:
        procs = {n: subprocess.Popen([sys.executable, __file__, "--child", n, d], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for n in VARIANTS}
        for n, p in procs.items():
            try:
                out, err = p.communicate(timeout=90)
                line = out.strip().splitlines()[-1] if out.strip() else json.dumps({"variant": n, "ok": False, "error": err.strip()[-300:]})
            except subprocess.TimeoutExpired:
                p.kill()
                line = json.dumps({"variant": n, "ok": False, "error": "timeout"})
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    else:
        sys.exit(main())
