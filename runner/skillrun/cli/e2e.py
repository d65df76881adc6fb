"""`skill-run e2e`: the user's workload as-is and with the planned ports routed in, interleaved.

    skill-run e2e --profile trace.json -- python workload.py
    skill-run e2e --plan plan.json --alternations 7 -- python serve_bench.py --batch 8
    skill-run e2e --profile t.json --shape 16,128,1280,8192 --check "python cmp.py" -- python loop.py
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from skillrun import api
from skillrun.cli.common import WORKLOAD_COMMAND, command_line, emit_json, err, guarded, index, out
from skillrun.errors import EXIT_FAILURE

HELP = ("Rerun a workload as-is and with the planned ports routed in (A/B interleaved), compare its outputs "
        "within the card's tolerance and measure the end-to-end gain beside the projection.\n\n"
        + "\n".join(line.strip() for line in __doc__.splitlines()[2:]))


@guarded
def e2e_cmd(
    command: List[str] = typer.Argument(..., metavar="-- COMMAND...", help="The workload, e.g. python workload.py."),
    profile: Optional[Path] = typer.Option(None, "--profile", "-p", help="Trace to plan from (like skill-run --profile)."),
    plan: Optional[Path] = typer.Option(None, "--plan", help="A plan from `skill-run plan --json`."),
    shape: Optional[List[str]] = typer.Option(None, "--shape", help="With --profile: shape for kernels the trace cannot size (repeatable)."),
    arch: Optional[str] = typer.Option(None, "--arch", help="With --profile: device arch when the trace does not say."),
    alternations: int = typer.Option(5, "--alternations", "-n", help="Timed runs per arm (A B A B ...), plus an A/A pair."),
    skip_steps: int = typer.Option(1, "--skip-steps", help="Steps (skillrun.profiling.step()) left out of each run as set-up."),
    check: Optional[str] = typer.Option(None, "--check", help="Command that compares the arms' outputs (gets "
                                        "$SKILLRUN_E2E_A_DIR/$SKILLRUN_E2E_B_DIR; exit 0 = same)."),
    gpu_time: Optional[bool] = typer.Option(None, "--gpu-time/--no-gpu-time", help="One profiled run per arm for GPU "
                                            "kernel time (default: when the workload used the GPU)."),
    include_slower: bool = typer.Option(False, "--include-slower", help="Also route shapes where the card expects "
                                        "the port to be slower (the plan keeps their baseline)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="cuda | rocm | cpu (default: the device present)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds one run may take."),
    no_write: bool = typer.Option(False, "--no-write", help="Do not write the e2e record."),
    as_json: bool = typer.Option(False, "--json", help="Print the record as JSON."),
):
    rec = api.e2e(list(command), index=index(), plan_file=plan, profile=profile, arch=arch, shapes=shape,
                  backend=backend, alternations=alternations, skip_steps=skip_steps, check=check, gpu_time=gpu_time,
                  timeout=timeout, write=not no_write, command_line=command_line(), include_slower=include_slower,
                  progress=None if as_json else (lambda msg: err.print(f"[dim]{msg}[/]")))
    if as_json:
        emit_json(rec)
    else:
        _print(rec)
    sys.stdout.flush()
    if rec["verdict_detail"]["outputs"] == "failed":
        raise typer.Exit(EXIT_FAILURE)


def answer_line(rec: dict) -> str:
    """The one line that answers `skill-run e2e`: measured step gain against the noise floor (coloured
    by meaning), beside the projection, and whether the outputs matched."""
    from skillrun.io.termtext import safe
    from skillrun.evidence.verdict import speed_style

    w = rec["measured"]["wall"]
    proj = rec["projection"]["gain_pct"]
    style = speed_style(w["speed"])
    gain = f"{w['gain_pct']:+.2f}% ({w['speed'].replace('_', ' ')}, noise floor {w['noise_floor_pct']:.2f}%)"
    return (f"[bold]Answer:[/] routing the ports in changed the workload's step time by "
            + (f"[{style}]{gain}[/]" if style else gain)
            + (f"; projected {proj:+.2f}%" if proj is not None else "")
            + f"; outputs {safe(rec['verdict_detail']['outputs'].replace('_', ' '))}")


def _print(rec: dict) -> None:
    w = rec["measured"]["wall"]
    out.print(answer_line(rec))
    out.print(f"[bold]e2e[/] {' '.join(rec['workload']['command'])}")
    for c in rec["cards"]:
        for it in c["items"]:
            shape = ",".join(f"{k}={v}" for k, v in it["shape"].items())
            proj = f"{it['projected_gain_pct']:+.2f}%" if it.get("projected_gain_pct") is not None else "—"
            out.print(f"  {c['id']} {it['recipe']} {shape}: routed {it['routed_calls']} call(s) per run, projected {proj}")
    for p in rec["routing"]["passed_through"][:6]:
        out.print(f"  passed through: {p['op']} ({p['reason']}) x{p['calls']}")
    out.print(f"  wall ({w['basis']}): A {w['a']['median_ms']:.4g} ms, B {w['b']['median_ms']:.4g} ms, gain {w['gain_pct']:+.2f}% "
                  f"(noise floor {w['noise_floor_pct']:.2f}%) -> {w['speed'].replace('_', ' ')}")
    gk = rec["measured"].get("gpu_kernel")
    if gk:
        out.print(f"  GPU kernel time: A {gk['a_ms']:.4g} ms, B {gk['b_ms']:.4g} ms, gain {gk['gain_pct']:+.2f}% "
                      f"(port kernels seen in B: {gk.get('port_kernel_calls_b')})")
    proj = rec["projection"]["gain_pct"]
    out.print(f"  projected f·(1−1/s): {proj:+.2f}% of GPU time" if proj is not None else "  projected: —")
    o = rec["outputs"]
    out.print(f"  outputs: {rec['verdict_detail']['outputs'].replace('_', ' ')}" + (f" ({o.get('error') or o.get('note')})" if o.get("error") or o.get("note") else ""))
    for n in rec["routing"]["notes"]:
        out.print(f"  [yellow]note:[/] {n}")
    if rec.get("artifact"):
        out.print(f"wrote {rec['artifact']}")


# What this module adds to `skill-run`, in the order `skill-run --help` lists it.
COMMANDS = (
    ("e2e", e2e_cmd, {"context_settings": WORKLOAD_COMMAND, "help": HELP}),
)
