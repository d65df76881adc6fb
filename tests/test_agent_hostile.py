"""Agent and MCP tools under attack: a folder swapped for a symlink between the check and the read
cannot leak a file from outside --allow; a NUL byte is a usage error; secrets glued to identifiers
or in forms our own prefixes miss are scrubbed; trace text is marked as untrusted data."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from kbfixture import make_kb
from skillrun.agent.safety import PathGuard
from skillrun.agent.tools import AgentTools, tool_specs
from skillrun.errors import UsageError
from skillrun.kb.index import SkillIndex
from skillrun.io.redact import REDACTED, scrub_text

pytestmark = pytest.mark.timeout(120)


def _trace(path: Path, kernel: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": 1.0, "dur": 50.0,
         "args": {"device": 0, "stream": 7}}]}))
    return path


@pytest.fixture
def world(tmp_path):
    kb = make_kb(tmp_path / "kb")
    allowed = tmp_path / "allowed"
    _trace(allowed / "dir" / "t.json", "inside_kernel")
    _trace(tmp_path / "secret" / "t.json", "outside_secret_kernel")
    specs = {s.name: s for s in tool_specs(AgentTools(SkillIndex.load(kb), [allowed], gpu_probe=lambda: None))}
    return tmp_path, allowed, specs


def _swap_to_outside(allowed: Path, secret: Path) -> None:
    os.rename(allowed / "dir", allowed / "dir.real")
    os.symlink(secret, allowed / "dir")


def _swap_back(allowed: Path) -> None:
    os.unlink(allowed / "dir")
    os.rename(allowed / "dir.real", allowed / "dir")


def test_a_swap_after_the_check_cannot_leak_a_file_from_outside(world, monkeypatch):
    """The attacker wins the race every time: the folder is swapped right after the path check."""
    tmp, allowed, specs = world
    real_resolve = PathGuard.resolve

    def resolve_then_swap(self, raw, what="path"):
        path = real_resolve(self, raw, what)
        _swap_to_outside(allowed, tmp / "secret")
        return path

    monkeypatch.setattr(PathGuard, "resolve", resolve_then_swap)
    res = specs["analyze_profile"].run(path=str(allowed / "dir" / "t.json"))
    assert "outside_secret_kernel" not in json.dumps(res)
    assert res["ok"] is False and "outside the paths" in res["error"]


def test_a_racing_swap_thread_never_leaks_in_a_few_seconds(world):
    tmp, allowed, specs = world
    stop = threading.Event()

    def swapper():
        while not stop.is_set():
            _swap_to_outside(allowed, tmp / "secret")
            _swap_back(allowed)

    t = threading.Thread(target=swapper, daemon=True)
    t.start()
    leaked, answered = 0, 0
    deadline = time.monotonic() + 4.0
    try:
        while time.monotonic() < deadline:
            res = specs["analyze_profile"].run(path=str(allowed / "dir" / "t.json"))
            text = json.dumps(res)
            leaked += "outside_secret_kernel" in text
            answered += "inside_kernel" in text
    finally:
        stop.set()
        t.join()
    assert leaked == 0
    assert answered > 0  # the tool still works while the folder is legitimately there


def test_a_nul_byte_in_a_path_is_a_usage_error(world):
    _, allowed, specs = world
    for tool in ("analyze_profile", "read_validation"):
        res = specs[tool].run(path=str(allowed) + "/t\x00.json")
        assert res["ok"] is False and "NUL" in res["error"] and "internal" not in res["error"].lower()
    with pytest.raises(UsageError):
        PathGuard(allowed).resolve("a\x00b")


def test_trace_text_is_marked_untrusted(world):
    _, allowed, specs = world
    res = specs["analyze_profile"].run(path=str(allowed / "dir" / "t.json"))
    assert res["ok"] and "untrusted" in res["untrusted_data"]
    assert res["profile"]["file"] == "t.json"  # the real name, not the pinned descriptor's


@pytest.mark.parametrize("secret", [
    "ghp_" + "A1b2" * 9,
    "AKIA" + "ABCDEFGHIJKLMNOP",
    "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=" + "Zm9v" * 22 + ";EndpointSuffix=core.windows.net",
    "dapi" + "0123456789abcdef" * 2,
    "SG." + "a" * 22 + "." + "b" * 43,
    "AGE-SECRET-KEY-1" + "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L" * 2,
    "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
])
@pytest.mark.parametrize("glue", ["", "MY_", "key_", "x=", " "])
def test_secrets_are_scrubbed_even_glued_after_an_underscore(secret, glue):
    out = scrub_text(f"run {glue}{secret} now")
    assert REDACTED in out
    core = secret.split("AccountKey=")[-1].split(";")[0] if "AccountKey" in secret else secret
    assert core[-12:] not in out


def test_a_private_key_block_is_removed_whole():
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\nAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----"
    out = scrub_text(f"cfg {key} tail")
    assert "b3BlbnNzaC1rZXkt" not in out and "AAAAMwAAAAtzc2gtZW" not in out and out.endswith(" tail")


@pytest.mark.parametrize("name", [
    "void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemmMultiD_ABScale_xdl_cshuffle_v3<ck::f8_fnuz_t>>",
    "triton_poi_fused__to_copy_add_mul_0d1d2de",
    "Cijk_Alik_Bljk_BBS_BH_MT256x128x64_ISA942_SK3_hf_bench",
    "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
    "nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN",
])
def test_kernel_names_are_not_mistaken_for_secrets(name):
    assert scrub_text(name) == name
