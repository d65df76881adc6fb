"""Options are validated before any work and give the documented exit codes; --kb/--json go anywhere;
help shows flags as flags with an example per command; trace text cannot inject terminal markup."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz"
CK_TRACE = REPO / "tests" / "fixtures" / "kineto_gfx950_ck_blockscale.synthetic.json"


def skill_run(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("SKILLRUN_DEBUG", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "skillrun", *args], capture_output=True, text=True, timeout=timeout, env=e)


def _no_traceback(res: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, res.stderr[-2000:]


# ------------------------------------------------------------------------------------------ --arch
@pytest.mark.parametrize("args", [
    ["--profile", str(EXAMPLE), "--arch", "sm90"],
    ["match", str(EXAMPLE), "--arch", "sm90"],
    ["plan", str(EXAMPLE), "--arch", "gfx-950"],
    ["kernels", str(EXAMPLE), "--arch", "sm90"],
])
def test_unknown_arch_is_a_usage_error_with_the_accepted_list(args):
    res = skill_run(*args)
    assert res.returncode == 2, res.stderr
    assert "accepted:" in res.stderr and "sm_90" in res.stderr and "gfx950" in res.stderr
    _no_traceback(res)


def test_arch_typo_gets_a_suggestion():
    res = skill_run("--profile", str(EXAMPLE), "--arch", "sm90")
    assert "did you mean sm_90" in res.stderr


def test_agent_tool_refuses_an_unknown_arch_with_the_same_list():
    from pydantic import ValidationError

    from skillrun.agent import schemas as S

    with pytest.raises(ValidationError) as exc:
        S.AnalyzeProfileArgs(path="trace.json", arch="sm90")
    assert "accepted" in str(exc.value) and "sm_90" in str(exc.value)
    assert S.AnalyzeProfileArgs(path="trace.json", arch="SM_90").arch == "sm_90"


def test_api_refuses_an_unknown_arch(tmp_path):
    from skillrun import api
    from skillrun.errors import UsageError

    with pytest.raises(UsageError) as exc:
        api.ingest_profile(EXAMPLE, arch="sm90")
    assert exc.value.exit_code == 2 and "accepted" in str(exc.value)


# ------------------------------------------------------------------------------------------ numbers, choices
@pytest.mark.parametrize("args", [
    ["--profile", str(EXAMPLE), "--top", "0"],
    ["--profile", str(EXAMPLE), "--seeds", "0"],
    ["--profile", str(EXAMPLE), "--rounds", "0"],
    ["match", str(EXAMPLE), "--top", "0"],
    ["run", "triton_fp8_blockscale_gemm_sm90", "--shape", "64,128,128", "--seeds", "0"],
    ["run", "triton_fp8_blockscale_gemm_sm90", "--shape", "64,128,128", "--rounds", "-1"],
])
def test_counts_must_be_at_least_one(args):
    res = skill_run(*args)
    assert res.returncode == 2, res.stdout[-500:] + res.stderr
    _no_traceback(res)


@pytest.mark.parametrize("args, word", [
    (["--profile", str(EXAMPLE), "--cold-l2", "cold"], "--cold-l2"),
    (["--profile", str(EXAMPLE), "--backend", "gpu"], "--backend"),
    (["run", "triton_fp8_blockscale_gemm_sm90", "--shape", "64,128,128", "--backend", "tpu"], "--backend"),
])
def test_backend_and_cold_l2_are_checked_without_run(args, word):
    res = skill_run(*args)
    assert res.returncode == 2 and word in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------ report / check
def test_report_on_a_non_artifact_file_is_exit_3_naming_it(tmp_path):
    f = tmp_path / "notes.yaml"
    f.write_text("just: notes\n")
    res = skill_run("report", str(f))
    assert res.returncode == 3, res.stdout + res.stderr
    assert str(f) in res.stderr and "not a validation artifact" in res.stderr
    _no_traceback(res)
    g = tmp_path / "trace.json"
    g.write_bytes(b"\x00\x01binary")
    res = skill_run("report", str(g))
    assert res.returncode == 3 and str(g) in res.stderr


def test_check_on_a_triton_card_is_a_usage_error_naming_what_check_takes():
    res = skill_run("check", "triton_fp8_blockscale_gemm_sm90")
    assert res.returncode == 2, res.stderr
    assert "FlyDSL" in res.stderr and "flydsl_fp8_blockscale_gemm" in res.stderr
    _no_traceback(res)


def test_check_on_a_non_amd_arch_is_a_usage_error():
    res = skill_run("check", "flydsl_fp8_blockscale_gemm", "--arch", "sm_90")
    assert res.returncode == 2 and "gfx942" in res.stderr and "gfx950" in res.stderr, res.stderr


# ------------------------------------------------------------------------------------------ --kb, --json anywhere
def _small_kb(tmp_path: Path) -> Path:
    kb = tmp_path / "kb"
    for d in ("skills", "facts", "schemas"):
        shutil.copytree(REPO / d, kb / d)
    (kb / "validation").mkdir()
    keep = "triton_fp8_blockscale_gemm_sm90"
    for card in (kb / "skills").iterdir():
        if card.is_dir() and card.name != keep:
            shutil.rmtree(card)
    return kb


@pytest.mark.parametrize("order", ["before", "after"])
def test_kb_and_json_work_before_or_after_the_command(tmp_path, order):
    kb = _small_kb(tmp_path)
    args = ["--kb", str(kb), "--json", "list"] if order == "before" else ["list", "--kb", str(kb), "--json"]
    res = skill_run(*args)
    assert res.returncode == 0, res.stderr
    assert [r["id"] for r in json.loads(res.stdout)["cards"]] == ["triton_fp8_blockscale_gemm_sm90"]


@pytest.mark.parametrize("cmd", [["show", "flydsl_fp8_blockscale_gemm"], ["kernels", str(EXAMPLE)], ["lint"],
                                 ["match", str(EXAMPLE)], ["plan", str(EXAMPLE)]])
def test_json_after_and_before_every_command_is_strict_json(cmd):
    for args in ([*cmd, "--json"], ["--json", *cmd]):
        res = skill_run(*args)
        assert res.returncode in (0, 1, 4), res.stderr
        json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


def test_json_before_a_command_from_another_module_sets_its_own_flag(tmp_path):
    res = skill_run("--json", "profile", "--tool", "nsys", "--no-analyze", "--", "true", env={"PATH": str(tmp_path)})
    # No nsys here: the command fails with its own error, but it ran in JSON mode (nothing on stdout
    # that is not JSON) and did not reject --json.
    assert res.returncode != 2 or "--json" not in res.stderr


def test_version():
    res = skill_run("--version")
    assert res.returncode == 0 and res.stdout.startswith("skill-run ")


def test_a_trace_without_profile_says_to_use_profile():
    res = skill_run(str(EXAMPLE))
    assert res.returncode == 2
    assert "--profile" in res.stderr and "not a command" in res.stderr


# ------------------------------------------------------------------------------------------ run without a GPU
def _gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(_gpu(), reason="checks the no-GPU path")
def test_run_without_gpu_is_refused_before_any_work_unless_cpu_was_asked_for(tmp_path):
    kb = _small_kb(tmp_path)
    shape = ["triton_fp8_blockscale_gemm_sm90", "--shape", "64,128,128", "--seeds", "1"]
    for args in (["run", *shape], ["--profile", str(EXAMPLE), "--run"]):
        res = skill_run("--kb", str(kb), *args)
        assert res.returncode == 5, res.stdout[-1500:] + res.stderr
        assert "no GPU" in res.stderr and "nothing was run" in res.stderr and "--backend cpu" in res.stderr
        # refused before computing: no table, no numerics, no artifact
        assert res.stdout == "" and not any((kb / "validation").rglob("*.yaml"))
    res = skill_run("run", *shape, "--no-write", "--backend", "cpu")
    assert res.returncode == 0, res.stdout[-1500:] + res.stderr
    assert "CPU numerics" in res.stderr and "error:" not in res.stderr


@pytest.mark.skipif(_gpu(), reason="checks the no-GPU path")
def test_backend_cuda_without_gpu_is_exit_5():
    res = skill_run("run", "triton_fp8_blockscale_gemm_sm90", "--shape", "64,128,128", "--backend", "cuda", "--no-write")
    assert res.returncode == 5 and "GPU" in res.stderr


# ------------------------------------------------------------------------------------------ help
def _commands():
    from skillrun.cli.entry import build_cli

    group = build_cli()
    return group, group.commands


def test_help_describes_every_option_with_an_example_and_no_python_types():
    group, commands = _commands()
    for name, cmd in [("", group), *commands.items()]:
        for p in cmd.params:
            assert (getattr(p, "help", None) or "").strip(), f"{name or 'skill-run'}: {p.name} has no help"
        res = skill_run(*([name] if name else []), "--help", env={"COLUMNS": "120"})
        assert res.returncode == 0, (name, res.stderr)
        text = res.stdout
        for bad in ("<bool>", "<str>", "<int>", "<path>", "list[", ":mod:", ":func:"):
            assert bad not in text, f"{name or 'skill-run'} --help shows {bad!r}"
        assert "Example" in text or "skill-run " in text.split("Options")[0], f"{name}: no example in --help"


# ------------------------------------------------------------------------------------------ escaping
HOSTILE = ["evil[/x]kernel", "void k[abi:cxx11]()", "[link=http://evil.example]click[/link]",
           "osc\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\", "bell\x07\x1b[2Jclear", "[bold red]fake MATCH[/]"]


def _hostile_trace(path: Path) -> Path:
    events = []
    for i, name in enumerate(HOSTILE):
        events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 100.0 * i, "dur": 50.0 + i,
                       "args": {"device": 0, "correlation": i + 1}})
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


@pytest.mark.parametrize("cmd", ["--profile", "kernels"])
def test_trace_text_cannot_inject_markup_or_escape_sequences(tmp_path, cmd):
    trace = _hostile_trace(tmp_path / "hostile.json")
    res = skill_run(*([cmd, str(trace)] if cmd == "kernels" else [cmd, str(trace)]), "--wide",
                    env={"COLUMNS": "200", "FORCE_COLOR": "0", "TERM": "dumb"})
    assert res.returncode in (0, 4), res.stderr
    _no_traceback(res)
    out = res.stdout
    assert "\x1b" not in out and "\x07" not in out  # no raw escape sequences reach the terminal
    assert "k[abi:cxx11]()" in out and "evil[/x]kernel" in out  # legitimate brackets intact
    assert "[link=http://evil.example]click[/link]" in out  # shown as text, not turned into a link
    assert "\\x1b]8;;http://evil.example" in out  # the OSC 8 hyperlink is shown escaped
    assert "[bold red]fake MATCH[/]" in out


def test_a_file_name_with_markup_is_shown_not_parsed(tmp_path):
    bad = tmp_path / "[/x][red]oops.json"
    res = skill_run("--profile", str(bad))
    assert res.returncode == 3
    _no_traceback(res)
    assert "[/x][red]oops.json" in res.stderr


def test_termtext_safe_escapes_controls_and_markup():
    from rich.console import Console

    from skillrun.io.termtext import plain, safe

    assert plain("a\x1b[31mb") == "a\\x1b[31mb"
    assert plain("tab\tkept") == "tab\tkept"
    assert plain("rtl\u202eoverride") == "rtl\\u202eoverride"
    c = Console(width=200, record=True, force_terminal=False)
    c.print(safe("f[abi:cxx11] [/x] [link=u]l[/link]"))
    assert c.export_text().strip() == "f[abi:cxx11] [/x] [link=u]l[/link]"


def test_check_rows_never_collapse_at_80_columns():
    from rich.console import Console

    from skillrun.cli.run import _rows_fit

    rows = [{"recipe": f"recipe_{i}_with_a_long_name", "kernel": "skillrun_kernels.fp8_blockscale_gemm.flydsl_4wave:build",
             "shape": "M=4096,N=65536,K=1536", "status": "compile_verified", "vgpr": 256, "spills": 0,
             "reason": "compiled for gfx950; 6 gate(s) passed"} for i in range(2)]
    for width in (80, 200):
        c = Console(width=width, record=True, file=open(os.devnull, "w"))
        c.print(_rows_fit(rows, width, "card: compile-only checks"))
        text = c.export_text()
        assert max(len(ln) for ln in text.splitlines()) <= width
        for r in rows:
            for v in r.values():
                assert str(v) in text.replace("\n", "") or str(v) in text  # every value shown whole
