"""`skill-run --profile TRACE` (the root command), `match`, `plan` and `kernels`: read a trace, rank
its hot kernels, match cards and plan; the root command with --run also executes the plan. The
entry module attaches :func:`main_cmd` as the root callback and ``COMMANDS`` as sub-commands."""
from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from skillrun import api
from skillrun.output import tabular
from skillrun.cli.common import (ARCH_HELP, FORMAT_HELP, SHAPE_HELP, TOP_HELP, WIDE_HELP, Backend, ColdL2, ItemProgress,
                                 OutFormat, command_line, console, cpu_fallback, cpu_note, devices_label, emit_json,
                                 emit_machine, err, exit_if_unwritten, exit_on_card_problems, guarded, index, out_format,
                                 print_analysis, print_results, report_unwritten, state, term_width, unbounded, want_json)
from skillrun.errors import EXIT_FAILURE, EXIT_NO_MATCH, EXIT_USAGE
from skillrun.io.termtext import safe


class DiffBy(str, Enum):
    kernel = "kernel"
    op = "op"


def _progress():
    """A rich progress bar fed by ingest's (done, total) byte callback; shown only for large files."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    prog = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(), console=err, transient=True)
    task = {"id": None}
    stop = prog.stop
    prog.stop = lambda: stop() if task["id"] is not None else None  # never started: print nothing

    def cb(done: int, total: int) -> None:
        if total < 64 * 1024 * 1024:
            return
        if task["id"] is None:
            prog.start()
            task["id"] = prog.add_task("reading trace", total=total)
        prog.update(task["id"], completed=done)
        if done >= total:
            prog.stop()

    return prog, cb



def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("skillrun")
        except PackageNotFoundError:
            v = "0.1.0 (not installed)"
        typer.echo(f"skill-run {v}")
        raise typer.Exit(0)



def main_cmd(
    ctx: typer.Context,
    profile: Optional[Path] = typer.Option(None, "--profile", "-p", metavar="TRACE", help="Profiler trace to analyse (format detected from content)."),
    arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=ARCH_HELP),
    top: int = typer.Option(20, "--top", min=1, metavar="N", help=TOP_HELP),
    shape: Optional[List[str]] = typer.Option(None, "--shape", metavar="SHAPE", help=SHAPE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables (also after a command: skill-run list --json)."),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    run: bool = typer.Option(False, "--run", help="Execute every planned recipe and write validation YAML.", rich_help_panel="With --run (on a GPU)"),
    kb: Optional[Path] = typer.Option(None, "--kb", metavar="DIR", help="Knowledge base folder (default: this checkout, the installed copy or $SKILLRUN_KB)."),
    backend: Optional[Backend] = typer.Option(None, "--backend", help="With --run: where to run (default: the GPU present). cpu checks numerics on a small proxy shape, no timing.", rich_help_panel="With --run (on a GPU)"),
    seeds: int = typer.Option(3, "--seeds", min=1, metavar="N", help="With --run: fresh random input sets for the parity gate (at least 1).", rich_help_panel="With --run (on a GPU)"),
    rounds: int = typer.Option(100, "--rounds", min=1, metavar="N", help="With --run: interleaved A/B timing rounds (at least 1).", rich_help_panel="With --run (on a GPU)"),
    cold_l2: ColdL2 = typer.Option(ColdL2.rotate, "--cold-l2", help="With --run: keep L2 cold by rotating input sets, by a flush kernel, or not at all.", rich_help_panel="With --run (on a GPU)"),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="With --run: time CUDA-graph replays instead of eager launches.", rich_help_panel="With --run (on a GPU)"),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version, help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print every match criterion with its reason."),
):
    state["kb"] = kb
    state["json"] = as_json
    if ctx.invoked_subcommand is not None:
        # `skill-run --json CMD`: commands with their own --json (as_json) see it as their default.
        sub = ctx.command.get_command(ctx, ctx.invoked_subcommand) if hasattr(ctx.command, "get_command") else None
        names = {p.name for p in getattr(sub, "params", [])}
        dm = {}
        if as_json and "as_json" in names:
            dm["as_json"] = True
        if kb is not None and "kb" in names:
            dm["kb"] = str(kb)
        if dm:
            ctx.default_map = {ctx.invoked_subcommand: dm}
        return
    if profile is None:
        if run or arch or shape:
            err.print("error: --run, --arch and --shape need --profile TRACE (see skill-run --help)")
            raise typer.Exit(EXIT_USAGE)
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    _analyse(profile, arch, top, shape, want_json(as_json), run, wide,
             dict(backend=backend.value if backend else None, seeds=seeds, rounds=rounds, cold_l2=cold_l2.value,
                  cuda_graph=cuda_graph), verbose=verbose)


@guarded
def _analyse(profile: Path, arch, top, shape, as_json, run, wide=False, exec_kw: dict | None = None,
             verbose: bool = False) -> None:
    idx = index()
    kw = dict(exec_kw or {})
    if run:  # a run that needs a GPU is refused before the trace is even read
        kw["backend"], _ = cpu_fallback(kw.get("backend"))
    prog, cb = _progress()
    try:
        a = api.analyze(profile, index=idx, arch=arch, top=top, shapes=shape, progress=cb)
    finally:
        prog.stop()
    if not as_json:
        # The analysis (answer first) is on screen before any run starts.
        print_analysis(a, top, wide, verbose=verbose)
        sys.stdout.flush()
    results = None
    if run:
        with ItemProgress() as on_item:
            results = api.execute(a.plan, idx, profile_source=str(profile), command=command_line(), on_item=on_item, **kw)
    if as_json:
        data = a.to_json(top)
        if results is not None:
            data["results"] = results
        emit_json(data)
        report_unwritten(results)
    elif results is not None:
        print_results(results)
    if kw.get("backend") == "cpu" and results is not None:
        cpu_note(results)
    exit_if_unwritten(results)
    exit_on_card_problems(a.matches.card_problems)
    if not a.matches.matches:
        raise typer.Exit(EXIT_NO_MATCH)
    if results is not None and any(r.get("verdict") in ("parity_failed", "error", "compile_failed") for r in results):
        raise typer.Exit(EXIT_FAILURE)


def _source_named(data: dict) -> dict:
    """`profile` is the analysed profile (an object) in `--profile --json`; here the trace's path is
    `source`, the name it has inside that object (one name per concept)."""
    if isinstance(data.get("profile"), str):
        data = {"source": data.pop("profile"), **data}
    return data


@guarded
def match_cmd(profile: Path = typer.Argument(..., metavar="TRACE", help="Profiler trace to match."),
              arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=ARCH_HELP),
              top: int = typer.Option(20, "--top", min=1, metavar="N", help=TOP_HELP),
              wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
              fmt: Optional[OutFormat] = typer.Option(None, "--format", help=FORMAT_HELP)):
    """Match a profile's hot kernels against every card; print each criterion, matches and near misses.

    Example: skill-run match trace.json.gz --arch gfx950
    """
    idx = index()
    prof = api.ingest_profile(profile, arch=arch)
    rep = api.match(prof, idx, top=top)
    if not emit_machine(out_format(fmt), lambda: {**_source_named(rep.model_dump(mode="json")), "hot_kernels": api.hot_kernels(prof, top)},
                        lambda: tabular.match_rows(rep)):
        print_analysis(api.Analysis(prof, rep, api.plan(prof, rep.model_copy(update={"matches": []}), idx)), top, wide,
                       answer=False)  # match plans nothing, so there is no gain to answer with
    exit_on_card_problems(rep.card_problems)
    if not rep.matches:
        raise typer.Exit(EXIT_NO_MATCH)


@guarded
def plan_cmd(profile: Path = typer.Argument(..., metavar="TRACE", help="Profiler trace to plan for."),
             arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=ARCH_HELP),
             top: int = typer.Option(20, "--top", min=1, metavar="N", help=TOP_HELP),
             shape: Optional[List[str]] = typer.Option(None, "--shape", metavar="SHAPE", help=SHAPE_HELP),
             wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
             fmt: Optional[OutFormat] = typer.Option(None, "--format", help=FORMAT_HELP),
             verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print every match criterion with its reason.")):
    """Ingest, match and pick a recipe per shape (nothing is run).

    Example: skill-run plan trace.json.gz --shape 4096,2048,7168
    """
    idx = index()
    a = api.analyze(profile, index=idx, arch=arch, top=top, shapes=shape)
    if not emit_machine(out_format(fmt), lambda: _source_named(a.plan.model_dump(mode="json")), lambda: tabular.plan_rows(a.plan)):
        print_analysis(a, top, wide, verbose=verbose)
    exit_on_card_problems(a.matches.card_problems)
    if not a.matches.matches:
        raise typer.Exit(EXIT_NO_MATCH)


@guarded
def kernels_cmd(profile: Path = typer.Argument(..., metavar="TRACE", help="Profiler trace to read."),
                other: Optional[Path] = typer.Argument(None, metavar="TRACE_B", help="A second trace: compare B with A per (kernel, shape)."),
                arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=ARCH_HELP),
                top: int = typer.Option(20, "--top", min=1, metavar="N", help="How many hot kernels to list (at least 1)."),
                wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
                details: bool = typer.Option(False, "--details", help="Under each kernel, its launch facts: grid, block, registers, shared memory/LDS, VGPRs, scratch (as the trace has them)."),
                by: DiffBy = typer.Option(DiffBy.kernel, "--by", help="With two traces: pair rows by kernel name and shape, or by (op, shape, dtype) across kernel names and vendors."),
                fmt: Optional[OutFormat] = typer.Option(None, "--format", help=FORMAT_HELP)):
    """Only the hot-kernel table: total GPU time, a row per kernel and per (kernel, shape) with op, dtype,
    calls, mean/median/sd/min/max, achieved throughput vs peak and the bound, GPU time by category,
    idle time and per-device totals (no matching).

    With two traces: per (kernel, launching op, shape) the time, calls and time per call in each, the
    deltas, and what appeared or disappeared in B; --by op pairs (op, shape, dtype) rows whatever kernel
    ran them (an MI300X trace against an H100 trace of the same model).

    Example: skill-run kernels trace.json.gz --top 30 --wide · skill-run kernels before.json.gz after.json.gz
    · skill-run kernels mi300x.json.gz h100.json.gz --by op
    """
    from skillrun.analysis.hot_table import breakdown_lines, render

    if other is not None:
        _compare(profile, other, arch, top, wide, out_format(fmt), by.value)
        return
    prof = api.ingest_profile(profile, arch=arch)
    data = api.hot_kernels(prof, top)
    if emit_machine(out_format(fmt), lambda: data, lambda: tabular.kernel_rows(data)):
        return
    width = term_width()
    wide = wide or unbounded(width)
    out = console(width)
    out.print(f"[bold]{safe(Path(prof.source).name)}[/]  format={prof.format}  arch={safe(prof.arch or 'unknown')}  ({safe(devices_label(prof))})")
    for w in prof.warnings:  # a graph capture, an inferred arch: said before the numbers they qualify
        out.print(f"[yellow]warning:[/] {safe(w)}")
    for line in breakdown_lines(data):
        out.print(safe(line))
    table = render(data, width, wide=wide, title=f"Hot kernels (top {min(top, len(prof.kernels))} of {len(prof.kernels)})",
                   details=details)
    (console(max(width, 10_000)) if wide else out).print(table, crop=not wide)


def _compare(a: Path, b: Path, arch: Optional[str], top: int, wide: bool, kind: str, by: str = "kernel") -> None:
    from skillrun.analysis import trace_diff

    d = api.compare_profiles(api.ingest_profile(a, arch=arch), api.ingest_profile(b, arch=arch), by=by)
    # Every row goes to a file: it is for filtering, not for reading top-down.
    if emit_machine(kind, lambda: d, lambda: trace_diff.diff_rows(d)):
        return
    width = term_width()
    wide = wide or unbounded(width)
    out = console(width)
    out.print(f"[bold]A[/] {safe(Path(d['a']).name)} (arch {safe(d['a_arch'] or 'unknown')})  "
              f"[bold]B[/] {safe(Path(d['b']).name)} (arch {safe(d['b_arch'] or 'unknown')})")
    out.print(safe(trace_diff.summary_line(d)))
    table = trace_diff.render(d, top, width, wide)
    (console(max(width, 10_000)) if wide else out).print(table, crop=not wide)


# What this module adds to `skill-run`, in the order `skill-run --help` lists it.
COMMANDS = (
    ("match", match_cmd, {}),
    ("plan", plan_cmd, {}),
    ("kernels", kernels_cmd, {}),
)
