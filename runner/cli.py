"""`skill-run`: thin typer commands over :mod:`skillrun.api`.

Registering a command from another module: ``from skillrun.cli import app`` then
``@app.command("name", help=...)`` (see :mod:`skillrun.cli_extra`). :func:`build_cli` gives every
command ``--kb`` and ``--json`` (before or after the command word), flag-style help, and exit
codes. A command that prints JSON declares ``as_json: bool = typer.Option(False, "--json", …)``
(that parameter name: ``skill-run --json NAME`` sets it) or reads :func:`want_json`; it reads the
knowledge base with :func:`index`.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
from enum import Enum
from functools import wraps
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer._click import exceptions as _cexc  # typer ships its own click
from typer.core import TyperGroup

from skillrun import api
from skillrun.errors import EXIT_FAILURE, EXIT_NO_MATCH, EXIT_UNAVAILABLE, EXIT_USAGE, InputError, SkillRunError
from skillrun.termtext import plain, plain_block, safe

HELP = """Read a GPU profile, rank its hot kernels, match expert skill cards and pick a recipe per shape;
`--run` also runs each port against its production reference and writes validation YAML.

Example: skill-run --profile trace.json.gz (torch.profiler, rocprofv3, rocpd, nsys, ncu; detected from content)

Exit codes: 0 ok · 1 a problem found (lint errors, failed gate, parity failure) · 2 usage error ·
3 unreadable or corrupt input file · 4 no card matched the profile · 5 backend, device or tool
unavailable. Set SKILLRUN_DEBUG=1 for tracebacks."""

_state: dict[str, Any] = {"kb": None, "json": False}


class _Group(TyperGroup):
    """`skill-run TRACE` (a file, not a command word) says to use --profile instead of 'No such command'."""

    def resolve_command(self, ctx, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except _cexc.UsageError:
            if args and not args[0].startswith("-") and (os.path.exists(args[0]) or "." in args[0] or "/" in args[0]):
                raise _cexc.UsageError(f"{plain(args[0])!s} is not a command; to analyse a trace use: "
                                       f"skill-run --profile {plain(args[0])}", ctx) from None
            raise


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=False, rich_markup_mode="rich", help=HELP,
                  context_settings={"help_option_names": ["-h", "--help"]})


def _width() -> int:
    """The terminal's width; when piped, $COLUMNS, else 80."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return max(40, int(cols))
    if sys.stdout.isatty():
        return max(40, shutil.get_terminal_size((80, 24)).columns)
    return 80


def _out(width: Optional[int] = None) -> Console:
    return Console(highlight=False, soft_wrap=False, width=width or _width(), markup=True)


err = Console(stderr=True, highlight=False, soft_wrap=True)
out = _out()  # for commands registered from other modules; this module makes one per print (width may change)


def index():
    """The knowledge base named by --kb (anywhere on the command line), else the default one."""
    return api.load_index(_state["kb"])


_index = index


def want_json(as_json: bool = False) -> bool:
    return bool(as_json or _state["json"])


def _emit_json(data: Any) -> None:
    # Strict JSON: NaN/Infinity (from a hostile trace or a broken timer) become null.
    from skillrun.strict_json import dumps

    sys.stdout.write(dumps(data, indent=2) + "\n")


def _exit_on_card_problems(problems) -> None:
    """Cards left out of matching are listed on stderr and the exit code is 1 (never silent)."""
    if not problems:
        return
    for p in problems:
        where = ": ".join(x for x in (p.path, p.field) if x)
        err.print(f"invalid card, not used: {safe(where)}: {safe(p.reason)}", markup=False, highlight=False)
    raise typer.Exit(EXIT_FAILURE)


def guarded(fn):
    """One clear line and a documented exit code for every failure; never a traceback by default."""

    @wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except (typer.Exit, _cexc.UsageError):
            raise
        except SkillRunError as exc:
            err.print(f"[bold red]error:[/] {safe(exc)}", markup=True, highlight=False)
            _state["error"] = {"reason": exc.reason, "path": exc.path, "field": exc.field, "hint": exc.hint,
                               "exit_code": exc.exit_code}
            raise typer.Exit(exc.exit_code)
        except KeyboardInterrupt:
            err.print("interrupted")
            _state["error"] = {"reason": "interrupted", "exit_code": 130}
            raise typer.Exit(130)
        except Exception as exc:  # noqa: BLE001 - the last line of defence for users
            if os.environ.get("SKILLRUN_DEBUG"):
                raise
            err.print(f"[bold red]internal error:[/] {safe(type(exc).__name__)}: {safe(exc)} (set SKILLRUN_DEBUG=1 for a traceback)")
            _state["error"] = {"reason": f"internal error: {type(exc).__name__}: {exc}", "exit_code": EXIT_FAILURE}
            raise typer.Exit(EXIT_FAILURE)

    return wrapper


class Backend(str, Enum):
    cuda = "cuda"
    rocm = "rocm"
    cpu = "cpu"


class ColdL2(str, Enum):
    rotate = "rotate"
    flush = "flush"
    off = "off"


ARCH_HELP = "Device arch when the trace does not say: gfx950, gfx942, gfx90a, sm_90, sm_100, … (a typo is an error)."
TOP_HELP = "How many hot kernels to rank and match (at least 1)."
SHAPE_HELP = "Shape for kernels whose shape the trace lacks, in the card's key order, e.g. 4096,2048,7168 (repeatable)."
WIDE_HELP = "Print kernel names whole (the table grows wider than the terminal)."


# --------------------------------------------------------------------------- profile → plan
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


def _devices_label(p) -> str:
    names = [d.name or d.arch or "?" for d in p.devices]
    if not names:
        return "unknown device"
    if len(set(names)) == 1:
        return (f"{len(names)}× " if len(names) > 1 else "") + names[0]
    return ", ".join(names)


def _print_analysis(a: "api.Analysis", top: int, wide: bool = False) -> None:
    from skillrun.hot_table import breakdown_lines, hot_kernels, render

    width = _width()
    out = _out(width)
    p = a.profile
    out.print(f"[bold]{safe(Path(p.source).name)}[/]  format={p.format}  arch={safe(p.arch or 'unknown')}  ({safe(_devices_label(p))})")
    out.print(f"GPU kernel time {p.total_kernel_us / 1e3:.3f} ms over {p.kernel_calls} kernel calls; "
              f"{p.linked_calls} calls linked to an op with shapes; shape unknown for {p.unattributed_us / 1e3:.3f} ms"
              + (f"; graph replay: {p.graph_replay.kernel_calls} kernel calls from {p.graph_replay.launches} graph launches" if p.graph_replay.detected else ""))
    for w in p.warnings:
        out.print(f"[yellow]warning:[/] {safe(w)}")
    data = hot_kernels(p, top)
    for line in breakdown_lines(data):
        out.print(safe(line))
    table = render(data, width, wide=wide, title=f"Hot kernels (top {min(top, len(p.kernels))} of {len(p.kernels)})")
    if wide:
        _out(10_000 if wide else width).print(table, crop=False)
    else:
        out.print(table)

    m = a.matches
    if m.communication:
        out.print(f"[dim]{len(m.communication)} communication kernel(s) (NCCL/RCCL) are listed but not offered to cards.[/]")
    if not m.matches:
        out.print("[bold yellow]No skill card matches a hot kernel of this profile.[/]")
    for res in m.matches + m.near_misses:
        tag = "[green]MATCH[/]" if res.matched else "[yellow]near miss[/]"
        out.print(f"{tag} [bold]{safe(res.skill_id)}[/] ← {safe(res.kernel[:100])} ({res.pct_gpu:.2f}% GPU)")
        for c in res.criteria:
            mark = "[green]✓[/]" if c.passed else "[red]✗[/]"
            out.print(f"    {mark} {safe(c.name)}: {safe(c.reason)}" + ("" if c.required else " [dim](informational)[/]"))

    from skillrun.plan import plan_lines

    for line in plan_lines(a.plan):
        out.print(line)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("skillrun")
        except PackageNotFoundError:
            v = "0.1.0 (not installed)"
        typer.echo(f"skill-run {v}")
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
def main_cmd(
    ctx: typer.Context,
    profile: Optional[Path] = typer.Option(None, "--profile", "-p", metavar="TRACE", help="Profiler trace to analyse (format detected from content)."),
    arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=ARCH_HELP),
    top: int = typer.Option(20, "--top", min=1, metavar="N", help=TOP_HELP),
    shape: Optional[List[str]] = typer.Option(None, "--shape", metavar="SHAPE", help=SHAPE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables (also after a command: skill-run list --json)."),
    wide: bool = typer.Option(False, "--wide", help=WIDE_HELP),
    run: bool = typer.Option(False, "--run", help="Execute every planned recipe and write validation YAML."),
    kb: Optional[Path] = typer.Option(None, "--kb", metavar="DIR", help="Knowledge base folder (default: this checkout, the installed copy or $SKILLRUN_KB)."),
    backend: Optional[Backend] = typer.Option(None, "--backend", help="With --run: where to run (default: the GPU present). cpu checks numerics on a small proxy shape, no timing."),
    seeds: int = typer.Option(3, "--seeds", min=1, metavar="N", help="With --run: fresh random input sets for the parity gate (at least 1)."),
    rounds: int = typer.Option(100, "--rounds", min=1, metavar="N", help="With --run: interleaved A/B timing rounds (at least 1)."),
    cold_l2: ColdL2 = typer.Option(ColdL2.rotate, "--cold-l2", help="With --run: keep L2 cold by rotating input sets, by a flush kernel, or not at all."),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="With --run: time CUDA-graph replays instead of eager launches."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version, help="Print the version and exit."),
):
    _state["kb"] = kb
    _state["json"] = as_json
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
                  cuda_graph=cuda_graph))


def _command_line() -> str:
    return " ".join(["skill-run", *sys.argv[1:]])


def _gpu_present() -> bool:
    from skillrun.execute.backends import detect_facts

    return detect_facts(None).kind != "cpu"


def _cpu_fallback(backend: Optional[str]) -> tuple[Optional[str], bool]:
    """(backend to run with, whether the user asked for CPU numerics). Without a GPU and without
    --backend, the runner still checks CPU numerics, then says so and exits 5."""
    if backend is not None:
        return backend, backend == "cpu"
    if _gpu_present():
        return None, False
    return "cpu", False


def _cpu_note(results: list[dict], asked: bool) -> None:
    proxies = sorted({json.dumps(r.get("proxy_shape")) for r in results if r.get("proxy_shape")})
    msg = ("no GPU was used: this measured CPU numerics of the port on a small proxy shape"
           + (f" ({', '.join(proxies)})" if proxies else "") + "; there is no timing and no speedup")
    if asked:
        err.print(f"[yellow]note:[/] {safe(msg)}")
    else:
        err.print(f"[bold red]error:[/] no GPU on this machine; {safe(msg)} (pass --backend cpu to ask for exactly "
                  "this, `skill-run check CARD` for FlyDSL compile-only gates, or run on a GPU)")


@guarded
def _analyse(profile: Path, arch, top, shape, as_json, run, wide=False, exec_kw: dict | None = None) -> None:
    idx = _index()
    prog, cb = _progress()
    try:
        a = api.analyze(profile, index=idx, arch=arch, top=top, shapes=shape, progress=cb)
    finally:
        prog.stop()
    results = None
    asked_cpu = False
    cpu_run = False
    if run:
        kw = dict(exec_kw or {})
        kw["backend"], asked_cpu = _cpu_fallback(kw.get("backend"))
        cpu_run = kw["backend"] == "cpu"
        results = api.execute(a.plan, idx, profile_source=str(profile), command=_command_line(), **kw)
    if as_json:
        data = a.to_json(top)
        if results is not None:
            data["results"] = results
        _emit_json(data)
        _report_unwritten(results or [])
    else:
        _print_analysis(a, top, wide)
        if results is not None:
            _print_results(results)
    if cpu_run and results is not None:
        _cpu_note(results, asked_cpu)
    _exit_if_unwritten(results)
    _exit_on_card_problems(a.matches.card_problems)
    if not a.matches.matches:
        raise typer.Exit(EXIT_NO_MATCH)
    if results is not None and any(r.get("verdict") in ("parity_failed", "error", "compile_failed") for r in results):
        raise typer.Exit(EXIT_FAILURE)
    if cpu_run and not asked_cpu:
        raise typer.Exit(EXIT_UNAVAILABLE)


def _print_results(results: list[dict]) -> None:
    from skillrun.report import report_table

    out = _out()
    out.print(report_table(results))
    for r in results:
        if r.get("artifact"):
            out.print(f"wrote {safe(r['artifact'])}")
    _report_unwritten(results)


def _report_unwritten(results: list[dict]) -> None:
    """Runs whose artifact could not be written: the verdict above stands, the cause is on stderr."""
    for r in results:
        if r.get("artifact_error"):
            err.print(f"[bold red]error:[/] the result above was not saved: {safe(r['artifact_error'])}", highlight=False)


def _exit_if_unwritten(results: list[dict] | None) -> None:
    if results and any(r.get("artifact_error") for r in results):
        raise typer.Exit(EXIT_FAILURE)


@app.command("match")
@guarded
def match_cmd(profile: Path = typer.Argument(..., metavar="TRACE", help="Profiler trace to match."),
              arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=ARCH_HELP),
              top: int = typer.Option(20, "--top", min=1, metavar="N", help=TOP_HELP),
              wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """Match a profile's hot kernels against every card; print each criterion, matches and near misses.

    Example: skill-run match trace.json.gz --arch gfx950
    """
    idx = _index()
    prof = api.ingest_profile(profile, arch=arch)
    rep = api.match(prof, idx, top=top)
    if want_json():
        _emit_json({**rep.model_dump(mode="json"), "hot_kernels": api.hot_kernels(prof, top)})
    else:
        _print_analysis(api.Analysis(prof, rep, api.plan(prof, rep.model_copy(update={"matches": []}), idx)), top, wide)
    _exit_on_card_problems(rep.card_problems)
    if not rep.matches:
        raise typer.Exit(EXIT_NO_MATCH)


@app.command("plan")
@guarded
def plan_cmd(profile: Path = typer.Argument(..., metavar="TRACE", help="Profiler trace to plan for."),
             arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=ARCH_HELP),
             top: int = typer.Option(20, "--top", min=1, metavar="N", help=TOP_HELP),
             shape: Optional[List[str]] = typer.Option(None, "--shape", metavar="SHAPE", help=SHAPE_HELP),
             wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """Ingest, match and pick a recipe per shape (nothing is run).

    Example: skill-run plan trace.json.gz --shape 4096,2048,7168
    """
    idx = _index()
    a = api.analyze(profile, index=idx, arch=arch, top=top, shapes=shape)
    if want_json():
        _emit_json(a.plan.model_dump(mode="json"))
    else:
        _print_analysis(a, top, wide)
    _exit_on_card_problems(a.matches.card_problems)
    if not a.matches.matches:
        raise typer.Exit(EXIT_NO_MATCH)


@app.command("kernels")
@guarded
def kernels_cmd(profile: Path = typer.Argument(..., metavar="TRACE", help="Profiler trace to read."),
                arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=ARCH_HELP),
                top: int = typer.Option(20, "--top", min=1, metavar="N", help="How many hot kernels to list (at least 1)."),
                wide: bool = typer.Option(False, "--wide", help=WIDE_HELP)):
    """Only the hot-kernel table: op, shape, dtype, calls, mean/min/max, achieved throughput vs peak,
    GPU time by category, idle time and per-device totals (no matching).

    Example: skill-run kernels trace.json.gz --top 30 --wide
    """
    from skillrun.hot_table import breakdown_lines, render

    prof = api.ingest_profile(profile, arch=arch)
    data = api.hot_kernels(prof, top)
    if want_json():
        _emit_json(data)
        return
    width = _width()
    out = _out(width)
    out.print(f"[bold]{safe(Path(prof.source).name)}[/]  format={prof.format}  arch={safe(prof.arch or 'unknown')}  ({safe(_devices_label(prof))})")
    for line in breakdown_lines(data):
        out.print(safe(line))
    table = render(data, width, wide=wide, title=f"Hot kernels (top {min(top, len(prof.kernels))} of {len(prof.kernels)})")
    (_out(10_000) if wide else out).print(table, crop=not wide)


# --------------------------------------------------------------------------- knowledge base
@app.command("lint")
@guarded
def lint_cmd():
    """Validate every card, fact and validation artifact; run each card's own test cases.

    Example: skill-run lint --kb ./my-kb
    """
    rep = api.lint_kb(_index())
    if want_json():
        _emit_json(rep.to_json())
    else:
        for e in rep.errors:
            err.print(f"[red]✗[/] {safe(e)}", highlight=False)
        c = rep.checked
        msg = f"{c.get('skills', 0)} skills, {c.get('facts', 0)} facts, {c.get('artifacts', 0)} validation artifacts checked"
        _out().print(("[green]lint ok:[/] " if rep.ok else f"[red]lint failed ({len(rep.errors)} errors):[/] ") + msg)
    if not rep.ok:
        raise typer.Exit(EXIT_FAILURE)


@app.command("list")
@guarded
def list_cmd():
    """List skill cards: id, device generations, what they port from and to, recipes, validation status.

    Example: skill-run list --json
    """
    idx = _index()
    rows = [{"id": c.id, "title": c.data["title"], "gens": c.gens, "from": c.match["from_backend"], "to": c.match["to_backend"],
             "recipes": [r.name for r in c.recipes], "validation": c.data["validation"]["status"]} for c in idx.skills.values()]
    if want_json():
        _emit_json(rows)
        _exit_on_card_problems(idx.problems)  # an invalid card is never dropped silently
        return
    t = Table(title=f"Skill cards ({safe(idx.root)})")
    for col in ("id", "gens", "from → to", "recipes", "validation"):
        t.add_column(col, overflow="fold")
    for r in rows:
        frm = r["from"] if isinstance(r["from"], str) else "/".join(r["from"])
        t.add_row(safe(r["id"]), safe(",".join(r["gens"])), safe(f"{frm} → {r['to']}"), safe(", ".join(r["recipes"])), safe(r["validation"]))
    _out().print(t)
    _exit_on_card_problems(idx.problems)


@app.command("show")
@guarded
def show_cmd(skill_id: str = typer.Argument(..., metavar="CARD", help="Card id, as `skill-run list` prints it.")):
    """Print one card: match signature, recipes, body (front matter as data with --json).

    Example: skill-run show flydsl_fp8_blockscale_gemm
    """
    card = _index().skill(skill_id)
    if want_json():
        _emit_json(card.to_json())
        return
    from rich.markdown import Markdown

    out = _out()
    out.print(f"[bold]{safe(card.id)}[/] — {safe(card.data['title'])}")
    out.print(f"gens {safe(card.gens)}  regex /{safe(card.regex)}/  min % GPU {card.min_pct_gpu}")
    for r in card.recipes:
        out.print(f"  recipe [bold]{safe(r.name)}[/] when `{safe(r.when)}` → {safe(r.kernel)} {safe(json.dumps(r.config))}")
    # Card text is untrusted: raw escapes are made visible and links printed as text (no OSC-8).
    out.print(Markdown(plain_block(card.body), hyperlinks=False))


@app.command("fact")
@guarded
def fact_cmd(fact_id: str = typer.Argument(..., metavar="FACT", help="Fact id, as a card's `facts` list names it.")):
    """Print one fact card.

    Example: skill-run fact gfx950_hardware
    """
    fact = _index().fact(fact_id)
    if want_json():
        _emit_json(fact.to_json())
        return
    from rich.markdown import Markdown

    out = _out()
    out.print(f"[bold]{safe(fact.id)}[/] — {safe(fact.data['title'])}")
    out.print(Markdown(plain_block(fact.body), hyperlinks=False))


# --------------------------------------------------------------------------- execution
@app.command("run")
@guarded
def run_cmd(skill_id: str = typer.Argument(..., metavar="CARD", help="Card id whose port to run."),
            shape: List[str] = typer.Option(..., "--shape", metavar="SHAPE", help="Shape(s) to run in the card's key order, e.g. 4096,2048,7168 (repeatable)."),
            backend: Optional[Backend] = typer.Option(None, "--backend", help="Where to run (default: the GPU present). cpu checks numerics on a small proxy shape, no timing."),
            seeds: int = typer.Option(3, "--seeds", min=1, metavar="N", help="Fresh random input sets for the parity gate (at least 1)."),
            rounds: int = typer.Option(100, "--rounds", min=1, metavar="N", help="Interleaved A/B timing rounds (at least 1)."),
            cold_l2: ColdL2 = typer.Option(ColdL2.rotate, "--cold-l2", help="Keep L2 cold by rotating input sets, by a flush kernel, or not at all."),
            cuda_graph: bool = typer.Option(False, "--cuda-graph", help="Time CUDA-graph replays instead of eager launches."),
            no_write: bool = typer.Option(False, "--no-write", help="Do not write validation YAML.")):
    """Run a card's port against its references for given shapes and write validation YAML.

    Example: skill-run run triton_fp8_blockscale_gemm_sm90 --shape 4096,7168,2048 --backend cuda
    """
    be, asked_cpu = _cpu_fallback(backend.value if backend else None)
    results = api.run_skill(_index(), skill_id, shape, backend=be, seeds=seeds, rounds=rounds, cold_l2=cold_l2.value,
                            cuda_graph=cuda_graph, write=not no_write, command=_command_line())
    if want_json():
        _emit_json(results)
        _report_unwritten(results)
    else:
        _print_results(results)
    if be == "cpu":
        _cpu_note(results, asked_cpu)
    _exit_if_unwritten(results)
    if any(r.get("verdict") in ("parity_failed", "error", "compile_failed") for r in results):
        raise typer.Exit(EXIT_FAILURE)
    if be == "cpu" and not asked_cpu:
        raise typer.Exit(EXIT_UNAVAILABLE)


def _rows_fit(rows: list[dict], width: int, title: str):
    """A table when it fits ``width``; else one block per row (label: value), which never collapses."""
    from rich.console import Group
    from rich.text import Text

    t = Table(title=title, title_justify="left")
    cols = list(rows[0]) if rows else []
    for c in cols:
        t.add_column(str(c), no_wrap=True)
    for r in rows:
        t.add_row(*[plain(v) for v in r.values()])
    probe = Console(width=100_000, file=open(os.devnull, "w"))
    need = probe.measure(t).maximum
    if need <= width:
        return t
    blocks: list = [Text(title, style="italic")]
    for r in rows:
        items = list(r.items())
        head = Text(f"{items[0][0]}: {plain(items[0][1])}", style="bold") if items else Text("")
        blocks.append(head)
        for k, v in items[1:]:
            blocks.append(Text(f"  {k}: {plain(v)}", overflow="fold"))
    return Group(*blocks)


@app.command("check")
@guarded
def check_cmd(skill_id: str = typer.Argument(..., metavar="CARD", help="Id of a FlyDSL card (its to_backend is flydsl)."),
              arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help="AMD target to compile for: gfx950 or gfx942 (default: the card's first gen)."),
              shape: Optional[List[str]] = typer.Option(None, "--shape", metavar="SHAPE", help="Shape(s) to compile in the card's key order (default: each recipe's own; repeatable)."),
              no_write: bool = typer.Option(False, "--no-write", help="Do not write compile-only validation YAML.")):
    """Compile a FlyDSL card's recipes for an AMD target without a GPU and apply the card's static gates
    (spills, scratch, occupancy, opcodes). Compile-only: no kernel runs, no timing.

    Example: skill-run check flydsl_fp8_blockscale_gemm --arch gfx950
    """
    rep = api.check(_index(), skill_id, arch=arch, shapes=shape, write=not no_write)
    if want_json():
        _emit_json(rep.to_json())
    else:
        out = _out()
        out.print(_rows_fit(rep.table(), _width(), f"{skill_id}: compile-only checks (no GPU was used; FlyDSL {rep.flydsl})"))
        out.print("[green]all gates passed[/]" if rep.passed else "[red]a gate failed[/]")
    if not rep.passed:
        raise typer.Exit(EXIT_FAILURE)


@app.command("report")
@guarded
def report_cmd(paths: Optional[List[Path]] = typer.Argument(None, metavar="ARTIFACT_OR_DIR", help="Validation artifacts or folders (default: validation/)."),
               html: Optional[Path] = typer.Option(None, "--html", metavar="FILE", help="Also write a self-contained HTML page here.")):
    """A reviewer's summary of validation artifacts: current / superseded / stale, measured GPU evidence
    first (and an HTML page with charts).

    Example: skill-run report validation/triton_fp8_blockscale_gemm_sm90 --html report.html
    """
    from skillrun.report import terminal_report, write_html
    from skillrun.validation import load_artifact

    idx = _index()
    # A file named on the command line must be an artifact (exit 3 naming it); inside folders a bad
    # file is a row marked invalid, so one broken file never hides the others.
    for p in paths or []:
        if Path(p).is_file():
            try:
                load_artifact(Path(p))
            except SkillRunError as exc:
                raise InputError(f"not a validation artifact: {exc.reason}", path=str(p), field=exc.field) from None
    ev = api.evidence(idx, paths)
    if want_json():
        _emit_json(ev.to_json())
    else:
        _out().print(terminal_report(ev))
    if html:
        page = write_html(ev, html)
        (_out() if not want_json() else err).print(f"wrote {safe(page)}")

@app.command("doctor")
@guarded
def doctor_cmd(timeout: float = typer.Option(120.0, "--timeout", min=1.0, metavar="SECONDS",
                                             help="Time limit for each FlyDSL test compile (a child process).")):
    """What this machine can do: device and arch; torch, triton, FlyDSL versions; whether FlyDSL
    compiles for gfx950/gfx942 here; which reference kernels are importable; what each missing
    piece disables and how to install it.

    Example: skill-run doctor --json
    """
    from skillrun.doctor import render_lines

    rep = api.doctor(flydsl_timeout_s=timeout)
    if want_json():
        _emit_json(rep)
    else:
        out = _out()
        for line, style in render_lines(rep):
            out.print(safe(line), style=style or None)


# --------------------------------------------------------------------------- the click command
def _set_json(ctx, param, value):
    if value:
        _state["json"] = True
    return value


def _set_kb(ctx, param, value):
    if value:
        _state["kb"] = Path(value)
    return value


_proto = typer.Typer(add_completion=False)


@_proto.command()
def _common_options(
    as_json: bool = typer.Option(False, "--json", callback=_set_json, help="Print JSON instead of tables."),
    kb: Optional[Path] = typer.Option(None, "--kb", metavar="DIR", callback=_set_kb,
                                      help="Knowledge base folder (default: this checkout, the installed copy or $SKILLRUN_KB)."),
):  # pragma: no cover - never invoked: its two options are copied onto commands that lack them
    pass


def _common_param(name: str):
    import copy

    proto = typer.main.get_command(_proto)
    p = copy.copy(next(p for p in proto.params if p.name == ("as_json" if name == "json" else "kb")))
    p.expose_value = False  # the callback records it; the command's function never sees it
    return p


def _tidy_help(cmd) -> None:
    """Flags are shown as flags and values by what they are (FILE, N, a|b), never as Python types."""
    for p in cmd.params:
        desc = getattr(p, "type_descriptor", None)
        if getattr(p, "is_flag", False) or getattr(p, "count", False):
            p.metavar = ""
        elif p.metavar is None and desc is not None:
            ann = desc.annotation
            if getattr(desc, "is_choice", False):
                p.metavar = "|".join(str(getattr(c, "value", c)) for c in (desc.choices or ()))
            elif ann is int or getattr(desc, "is_ranged", False):
                p.metavar = "N"
            elif ann is float:
                p.metavar = "X"
            elif getattr(desc, "is_path", False):
                p.metavar = "PATH"
            else:
                p.metavar = (p.name or "value").upper()
        if type(p).__name__ == "TyperArgument":
            mv = p.metavar
            p.display_type_rich = lambda ctx, _mv=mv: None  # the metavar already says what it is
    if not getattr(cmd, "_skillrun_help_tidy", False):
        orig = cmd.get_help_option

        def help_option(ctx, _orig=orig):
            opt = _orig(ctx)
            if opt is not None:
                opt.metavar = ""  # -h/--help is a flag too
            return opt

        cmd.get_help_option = help_option
        cmd._skillrun_help_tidy = True


def build_cli() -> click.Group:
    """The click group behind `skill-run`, with every registered command (from any module) given
    --kb and --json and tidy help."""
    from skillrun import cli_extra  # noqa: F401  (profile, agent, mcp, … attach themselves)

    group = typer.main.get_command(app)
    _tidy_help(group)
    for sub in group.commands.values():
        names = {p.name for p in sub.params}
        opts = {o for p in sub.params for o in getattr(p, "opts", [])}
        if "--json" not in opts and "as_json" not in names:
            sub.params.append(_common_param("json"))
        if "--kb" not in opts and "kb" not in names:
            sub.params.append(_common_param("kb"))
        _tidy_help(sub)
    return group


class _Watched:
    """sys.stdout, noting whether anything was written (to know if a --json error needs an object)."""

    def __init__(self, inner):
        self._inner = inner
        self.wrote = False

    def write(self, text):
        if text:
            self.wrote = True
        return self._inner.write(text)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _json_error_object(code: int) -> dict:
    """What a failed --json call prints when the command printed nothing on stdout."""
    known = _state.get("error")
    if known:
        return {"error": {k: v for k, v in known.items() if v is not None}}
    # Failures reported with a message and an exit (no exception): the last line written to stderr.
    lines = [ln.strip() for ln in err.export_text(clear=False).splitlines() if ln.strip()]
    reason = lines[-1] if lines else f"failed with exit code {code}"
    for prefix in ("error: ", "error:"):
        reason = reason[len(prefix):] if reason.startswith(prefix) else reason
    return {"error": {"reason": reason, "exit_code": code}}


def _on_sigterm(signum, frame) -> None:
    # Unwind like Ctrl-C does (finally blocks, atexit): temporary folders are removed and helper
    # processes stopped, where the default action would end the process on the spot.
    raise SystemExit(128 + signum)


def main() -> None:
    """`skill-run`: with --json, every failure also prints one JSON error object on stdout
    (unless the command already printed its JSON, which then carries the result)."""
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    args = sys.argv[1:]
    wants_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    if not wants_json:
        build_cli()(prog_name="skill-run")
        return
    watched = _Watched(sys.stdout)
    sys.stdout = watched
    err.record = True  # keep stderr's text to name the cause of failures that raise no exception
    try:
        rc = build_cli()(prog_name="skill-run", standalone_mode=False)
    except _cexc.ClickException as exc:
        exc.show()
        rc = exc.exit_code
        _state["error"] = {"reason": exc.format_message(), "exit_code": rc}
    except _cexc.Abort:
        err.print("aborted")
        rc = 130
    code = rc if isinstance(rc, int) and not isinstance(rc, bool) else 0
    if code and not watched.wrote:
        from skillrun.strict_json import dumps

        watched.write(dumps(_json_error_object(code), indent=2) + "\n")
    sys.stdout.flush()
    sys.exit(code)


if __name__ == "__main__":
    main()
