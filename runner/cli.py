"""`skill-run`: thin typer commands over :mod:`skillrun.api`.

Exit codes: 0 ok · 1 the command found a problem (lint errors, failed gate, parity failure) ·
2 usage error · 3 unreadable/corrupt/unsupported input file · 4 no card matched the profile ·
5 backend/device/tool unavailable. Set SKILLRUN_DEBUG=1 for tracebacks.
"""
from __future__ import annotations

import json
import os
import sys
from functools import wraps
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from skillrun import api
from skillrun.errors import EXIT_FAILURE, EXIT_NO_MATCH, SkillRunError

app = typer.Typer(add_completion=False, no_args_is_help=False, rich_markup_mode="rich",
                  help=__doc__, context_settings={"help_option_names": ["-h", "--help"]})
out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)

_state: dict[str, Any] = {"kb": None}


def _index():
    return api.load_index(_state["kb"])


def _emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def guarded(fn):
    """One clear line and a documented exit code for every failure; never a traceback by default."""

    @wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except typer.Exit:
            raise
        except SkillRunError as exc:
            err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
            raise typer.Exit(exc.exit_code)
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130)
        except Exception as exc:  # noqa: BLE001 - the last line of defence for users
            if os.environ.get("SKILLRUN_DEBUG"):
                raise
            err.print(f"[bold red]internal error:[/] {type(exc).__name__}: {exc} (set SKILLRUN_DEBUG=1 for a traceback)")
            raise typer.Exit(EXIT_FAILURE)

    return wrapper


# --------------------------------------------------------------------------- profile → plan
def _progress():
    """A rich progress bar fed by ingest's (done, total) byte callback; shown only for large files."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    prog = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn(), console=err, transient=True)
    task = {"id": None}

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


def _print_analysis(a: "api.Analysis", top: int) -> None:
    p = a.profile
    dev = ", ".join(filter(None, [d.name for d in p.devices])) or "unknown device"
    out.print(f"[bold]{Path(p.source).name}[/]  format={p.format}  arch={p.arch or 'unknown'}  ({dev})")
    out.print(f"GPU kernel time {p.total_kernel_us / 1e3:.3f} ms over {p.kernel_calls} kernel calls; "
              f"{p.linked_calls} calls linked to an op with shapes; unattributed {p.unattributed_us / 1e3:.3f} ms"
              + (f"; graph replay: {p.graph_replay.kernel_calls} kernel calls from {p.graph_replay.launches} graph launches" if p.graph_replay.detected else ""))
    for w in p.warnings:
        out.print(f"[yellow]warning:[/] {w}")
    t = Table(title=f"Hot kernels (top {min(top, len(p.kernels))} of {len(p.kernels)})", show_lines=False)
    for c in ("#", "% GPU", "total ms", "calls", "shape source", "kernel"):
        t.add_column(c, justify="right" if c in ("#", "% GPU", "total ms", "calls") else "left", overflow="fold")
    for i, k in enumerate(p.kernels[:top], 1):
        t.add_row(str(i), f"{k.pct_gpu:.2f}", f"{k.total_us / 1e3:.3f}", str(k.calls), k.shape_provenance, k.name[:160])
    out.print(t)

    m = a.matches
    if not m.matches:
        out.print("[bold yellow]No skill card matches a hot kernel of this profile.[/]")
    for res in m.matches + m.near_misses:
        tag = "[green]MATCH[/]" if res.matched else "[yellow]near miss[/]"
        out.print(f"{tag} [bold]{res.skill_id}[/] ← {res.kernel[:100]} ({res.pct_gpu:.2f}% GPU)")
        for c in res.criteria:
            mark = "[green]✓[/]" if c.passed else "[red]✗[/]"
            out.print(f"    {mark} {c.name}: {c.reason}" + ("" if c.required else " [dim](informational)[/]"))

    if a.plan.items:
        out.print("[bold]Plan[/] (expected speedups are the card's prior until a run measures them)")
    for i, it in enumerate(a.plan.items, 1):
        shape = ",".join(f"{k}={v}" for k, v in (it.shape or {}).items()) or "shape unresolved"
        out.print(f"[bold][{i}][/] {it.skill_id}  {shape}  [dim]({it.shape_provenance}, {it.pct_gpu:.2f}% of GPU time)[/]")
        if it.recipe:
            tag = " [bold yellow]UNTUNED[/]" if it.untuned else ""
            out.print(f"    recipe [bold]{it.recipe}[/]{tag} → {it.kernel_ref} {json.dumps(it.config)}")
            if it.lever:
                out.print(f"    lever: {it.lever}")
        refs = it.references
        base = ", ".join(f"{k}={v}" for k, v in refs.get("baseline", {}).items())
        out.print(f"    references: oracle {refs.get('oracle', '—')}; baseline {base or '—'}")
        if it.expected_speedup:
            gain = f"{it.projected_e2e_gain_pct:.2f}% of GPU time" if it.projected_e2e_gain_pct is not None else "—"
            out.print(f"    expected {it.expected_speedup:.2f}× isolated → projected end-to-end gain f·(1−1/s) = {gain}")
        for n in it.notes:
            out.print(f"    [yellow]note:[/] {n}")


@app.callback(invoke_without_command=True)
def main_cmd(
    ctx: typer.Context,
    profile: Optional[Path] = typer.Option(None, "--profile", "-p", help="Profiler trace to analyse (format detected from content)."),
    arch: Optional[str] = typer.Option(None, "--arch", help="Device arch (gfx950, gfx942, sm_90) when the trace does not say."),
    top: int = typer.Option(20, "--top", help="How many hot kernels to rank and match."),
    shape: Optional[List[str]] = typer.Option(None, "--shape", help="Shape for unresolved kernels, e.g. 4096,2048,7168 (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    run: bool = typer.Option(False, "--run", help="Execute every planned recipe and write validation YAML."),
    kb: Optional[Path] = typer.Option(None, "--kb", help="Knowledge base folder (default: checkout / installed copy / $SKILLRUN_KB)."),
    backend: Optional[str] = typer.Option(None, "--backend", help="With --run: cuda | rocm | cpu (default: the device present)."),
    seeds: int = typer.Option(3, "--seeds", help="With --run: fresh random input sets for the parity gate."),
    rounds: int = typer.Option(100, "--rounds", help="With --run: interleaved A/B timing rounds."),
    cold_l2: str = typer.Option("rotate", "--cold-l2", help="With --run: rotate | flush | off."),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="With --run: time CUDA-graph replays."),
):
    """Read a profile, rank hot kernels, match skill cards, pick recipes; `--run` also executes them."""
    _state["kb"] = kb
    if ctx.invoked_subcommand is not None:
        return
    if profile is None:
        out.print(ctx.get_help())
        raise typer.Exit(0)
    _analyse(profile, arch, top, shape, as_json, run,
             dict(backend=backend, seeds=seeds, rounds=rounds, cold_l2=cold_l2, cuda_graph=cuda_graph))


def _command_line() -> str:
    return " ".join(["skill-run", *sys.argv[1:]])


@guarded
def _analyse(profile: Path, arch, top, shape, as_json, run, exec_kw: dict | None = None) -> None:
    index = _index()
    prog, cb = _progress()
    try:
        a = api.analyze(profile, index=index, arch=arch, top=top, shapes=shape, progress=cb)
    finally:
        prog.stop()
    results = None
    if run:
        results = api.execute(a.plan, index, profile_source=str(profile), command=_command_line(), **(exec_kw or {}))
    if as_json:
        data = a.to_json(top)
        if results is not None:
            data["results"] = results
        _emit_json(data)
    else:
        _print_analysis(a, top)
        if results is not None:
            _print_results(results)
    if not a.matches.matches:
        raise typer.Exit(EXIT_NO_MATCH)
    if results is not None and any(r.get("verdict") in ("parity_failed", "error", "compile_failed") for r in results):
        raise typer.Exit(EXIT_FAILURE)


def _print_results(results: list[dict]) -> None:
    from skillrun.report import report_table

    out.print(report_table(results))
    for r in results:
        if r.get("artifact"):
            out.print(f"wrote {r['artifact']}")


@app.command("match")
@guarded
def match_cmd(profile: Path, arch: Optional[str] = typer.Option(None, "--arch"), top: int = typer.Option(20, "--top"),
              as_json: bool = typer.Option(False, "--json")):
    """Match a profile's hot kernels against every card; print criteria, matches and near misses."""
    index = _index()
    prof = api.ingest_profile(profile, arch=arch)
    rep = api.match(prof, index, top=top)
    if as_json:
        _emit_json(rep.model_dump(mode="json"))
    else:
        _print_analysis(api.Analysis(prof, rep, api.plan(prof, rep.model_copy(update={"matches": []}), index)), top)
    if not rep.matches:
        raise typer.Exit(EXIT_NO_MATCH)


@app.command("plan")
@guarded
def plan_cmd(profile: Path, arch: Optional[str] = typer.Option(None, "--arch"), top: int = typer.Option(20, "--top"),
             shape: Optional[List[str]] = typer.Option(None, "--shape"), as_json: bool = typer.Option(False, "--json")):
    """Ingest, match and plan (no execution)."""
    index = _index()
    a = api.analyze(profile, index=index, arch=arch, top=top, shapes=shape)
    if as_json:
        _emit_json(a.plan.model_dump(mode="json"))
    else:
        _print_analysis(a, top)
    if not a.matches.matches:
        raise typer.Exit(EXIT_NO_MATCH)


# --------------------------------------------------------------------------- knowledge base
@app.command("lint")
@guarded
def lint_cmd(as_json: bool = typer.Option(False, "--json")):
    """Validate every card, fact and validation artifact; run each card's own test cases."""
    rep = api.lint_kb(_index())
    if as_json:
        _emit_json(rep.to_json())
    else:
        for e in rep.errors:
            err.print(f"[red]✗[/] {e}", highlight=False)
        c = rep.checked
        msg = f"{c.get('skills', 0)} skills, {c.get('facts', 0)} facts, {c.get('artifacts', 0)} validation artifacts checked"
        out.print(("[green]lint ok:[/] " if rep.ok else f"[red]lint failed ({len(rep.errors)} errors):[/] ") + msg)
    if not rep.ok:
        raise typer.Exit(EXIT_FAILURE)


@app.command("list")
@guarded
def list_cmd(as_json: bool = typer.Option(False, "--json")):
    """List skill cards."""
    index = _index()
    rows = [{"id": c.id, "title": c.data["title"], "gens": c.gens, "from": c.match["from_backend"], "to": c.match["to_backend"],
             "recipes": [r.name for r in c.recipes], "validation": c.data["validation"]["status"]} for c in index.skills.values()]
    if as_json:
        _emit_json(rows)
        return
    t = Table(title=f"Skill cards ({index.root})")
    for col in ("id", "gens", "from → to", "recipes", "validation"):
        t.add_column(col, overflow="fold")
    for r in rows:
        frm = r["from"] if isinstance(r["from"], str) else "/".join(r["from"])
        t.add_row(r["id"], ",".join(r["gens"]), f"{frm} → {r['to']}", ", ".join(r["recipes"]), r["validation"])
    out.print(t)


@app.command("show")
@guarded
def show_cmd(skill_id: str, as_json: bool = typer.Option(False, "--json")):
    """Print one card (front matter as data with --json)."""
    card = _index().skill(skill_id)
    if as_json:
        _emit_json(card.to_json())
        return
    from rich.markdown import Markdown

    out.print(f"[bold]{card.id}[/] — {card.data['title']}")
    out.print(f"gens {card.gens}  regex /{card.regex}/  min % GPU {card.min_pct_gpu}")
    for r in card.recipes:
        out.print(f"  recipe [bold]{r.name}[/] when `{r.when}` → {r.kernel} {json.dumps(r.config)}")
    out.print(Markdown(card.body))


@app.command("fact")
@guarded
def fact_cmd(fact_id: str, as_json: bool = typer.Option(False, "--json")):
    """Print one fact card."""
    fact = _index().fact(fact_id)
    if as_json:
        _emit_json(fact.to_json())
        return
    from rich.markdown import Markdown

    out.print(f"[bold]{fact.id}[/] — {fact.data['title']}")
    out.print(Markdown(fact.body))


# --------------------------------------------------------------------------- execution
@app.command("run")
@guarded
def run_cmd(skill_id: str, shape: List[str] = typer.Option(..., "--shape", help="Shape(s) to run, e.g. 4096,2048,7168."),
            backend: Optional[str] = typer.Option(None, "--backend", help="cuda | rocm | cpu (default: the device present)."),
            seeds: int = typer.Option(3, "--seeds"), rounds: int = typer.Option(100, "--rounds"),
            cold_l2: str = typer.Option("rotate", "--cold-l2", help="rotate | flush | off"),
            cuda_graph: bool = typer.Option(False, "--cuda-graph"),
            as_json: bool = typer.Option(False, "--json"),
            no_write: bool = typer.Option(False, "--no-write", help="Do not write validation YAML.")):
    """Run a card's port against its references for given shapes and write validation YAML."""
    results = api.run_skill(_index(), skill_id, shape, backend=backend, seeds=seeds, rounds=rounds, cold_l2=cold_l2,
                            cuda_graph=cuda_graph, write=not no_write, command=_command_line())
    if as_json:
        _emit_json(results)
    else:
        _print_results(results)
    if any(r.get("verdict") in ("parity_failed", "error", "compile_failed") for r in results):
        raise typer.Exit(EXIT_FAILURE)


@app.command("check")
@guarded
def check_cmd(skill_id: str, arch: Optional[str] = typer.Option(None, "--arch"), shape: Optional[List[str]] = typer.Option(None, "--shape"),
              as_json: bool = typer.Option(False, "--json"), no_write: bool = typer.Option(False, "--no-write")):
    """Compile a FlyDSL card's recipes for the target arch without a GPU and apply the card's static gates."""
    rep = api.check(_index(), skill_id, arch=arch, shapes=shape, write=not no_write)
    if as_json:
        _emit_json(rep.to_json())
    else:
        rows = rep.table()
        t = Table(title=f"{skill_id}: compile-only checks (no GPU was used)")
        for c in (rows[0] if rows else {}):
            t.add_column(str(c), overflow="fold")
        for r in rows:
            t.add_row(*[str(v) for v in r.values()])
        out.print(t)
        out.print("[green]all gates passed[/]" if rep.passed else "[red]a gate failed[/]")
    if not rep.passed:
        raise typer.Exit(EXIT_FAILURE)


@app.command("report")
@guarded
def report_cmd(paths: Optional[List[Path]] = typer.Argument(None, help="Artifacts or folders (default: validation/)."),
               html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML page here."),
               as_json: bool = typer.Option(False, "--json")):
    """A reviewer's table of validation artifacts (and an HTML page with speedup charts)."""
    from skillrun.report import load_artifacts, report_table, write_html

    index = _index()
    records = load_artifacts(paths or [index.root / "validation"])
    if as_json:
        _emit_json(records)
    else:
        out.print(report_table(records))
    if html:
        page = write_html(records, html)
        out.print(f"wrote {page}")


def main() -> None:
    # Subcommands registered in other modules (profile, agent, mcp) attach themselves here.
    from skillrun import cli_extra  # noqa: F401
    from skillrun.cli_e2e import register as _register_e2e; _register_e2e(app)  # noqa: E702 - `skill-run e2e`

    app()


if __name__ == "__main__":
    main()
