"""`skill-run run`, `check`, `report` and `doctor`: run a port against its references, compile-check a
FlyDSL card without a GPU, summarise validation artifacts, say what this machine can do."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from skillrun import api
from skillrun.output import tabular
from skillrun.cli.common import (FORMAT_HELP, Backend, ColdL2, ItemProgress, OutFormat, busy, command_line, console,
                                 cpu_fallback, cpu_note, emit_json, emit_machine, err, exit_if_unwritten, guarded, index,
                                 out_format, print_results, report_unwritten, term_width, want_json)
from skillrun.errors import EXIT_FAILURE, InputError, SkillRunError, UsageError
from skillrun.io.termtext import plain, safe


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
    be, _ = cpu_fallback(backend.value if backend else None)  # refuses here, before any work, without a GPU
    with ItemProgress() as on_item:
        results = api.run_skill(index(), skill_id, shape, backend=be, seeds=seeds, rounds=rounds, cold_l2=cold_l2.value,
                                cuda_graph=cuda_graph, write=not no_write, command=command_line(), on_item=on_item)
    if want_json():
        emit_json(results, "results")
        report_unwritten(results)
    else:
        print_results(results)
    if be == "cpu":
        cpu_note(results)
    exit_if_unwritten(results)
    if any(r.get("verdict") in ("parity_failed", "error", "compile_failed") for r in results):
        raise typer.Exit(EXIT_FAILURE)



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



@guarded
def check_cmd(skill_id: str = typer.Argument(..., metavar="CARD", help="Id of a FlyDSL card (its to_backend is flydsl)."),
              arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help="AMD target to compile for: gfx950 or gfx942 (default: the card's first gen)."),
              shape: Optional[List[str]] = typer.Option(None, "--shape", metavar="SHAPE", help="Shape(s) to compile in the card's key order (default: each recipe's own; repeatable)."),
              no_write: bool = typer.Option(False, "--no-write", help="Do not write compile-only validation YAML.")):
    """Compile a FlyDSL card's recipes for an AMD target without a GPU and apply the card's static gates
    (spills, scratch, occupancy, opcodes). Compile-only: no kernel runs, no timing.

    Example: skill-run check flydsl_fp8_blockscale_gemm --arch gfx950
    """
    with busy(f"compiling {skill_id} for {arch or 'its target'} (compile-only)"):
        rep = api.check(index(), skill_id, arch=arch, shapes=shape, write=not no_write)
    if want_json():
        emit_json(rep.to_json())
    else:
        out = console()
        out.print(_rows_fit(rep.table(), term_width(), f"{skill_id}: compile-only checks (no GPU was used; FlyDSL {rep.flydsl})"))
        out.print("[green]all gates passed[/]" if rep.passed else "[red]a gate failed[/]")
    unsaved = [{"artifact_error": c.artifact_error} for c in rep.checks if c.artifact_error]
    report_unwritten(unsaved)
    exit_if_unwritten(unsaved)
    if not rep.passed:
        raise typer.Exit(EXIT_FAILURE)


@guarded
def report_cmd(paths: Optional[List[Path]] = typer.Argument(None, metavar="ARTIFACT_OR_DIR", help="Validation artifacts or folders (default: validation/)."),
               html: Optional[Path] = typer.Option(None, "--html", metavar="FILE", help="Also write a self-contained HTML page here."),
               fmt: Optional[OutFormat] = typer.Option(None, "--format", help=FORMAT_HELP),
               samples: bool = typer.Option(False, "--samples", help="Also show each current artifact's raw timing samples "
                                            "per slot: kept count, p10 / median / p90 ms, median per position in the round, "
                                            "and the timing engine's warnings (shown anyway when one artifact file is named)."),
               markdown: bool = typer.Option(False, "--markdown", help="Print the README's generated tables (card "
                                             "statuses, current GPU evidence) as markdown, from the evidence."),
               write: bool = typer.Option(False, "--write", help="With --markdown: rewrite every generated block "
                                          "(README.md and each card's evidence table) from the evidence.")):
    """A reviewer's summary of validation artifacts: current / superseded / stale, measured GPU evidence
    first (and an HTML page with charts and raw-sample distributions).

    Example: skill-run report validation/triton_fp8_blockscale_gemm_sm90 --html report.html
    """
    from skillrun.output.report import evidence_answer, samples_report, terminal_report, write_html
    from skillrun.evidence.validation import load_artifact

    idx = index()
    # A file named on the command line must be an artifact (exit 3 naming it); inside folders a bad
    # file is a row marked invalid, so one broken file never hides the others.
    for p in paths or []:
        if Path(p).is_file():
            try:
                load_artifact(Path(p))
            except SkillRunError as exc:
                raise InputError(f"not a validation artifact: {exc.reason}", path=str(p), field=exc.field) from None
    ev = api.evidence(idx, paths)
    if write and not markdown:
        raise UsageError("--write rewrites the generated markdown blocks: give it with --markdown", field="--write")
    if markdown:
        from skillrun.output import markdown as md

        if write:
            for p in md.write_documents(idx.root, ev):
                console().print(f"wrote {safe(p)}")
            return
        # artifact text is data: controls made visible, nothing wrapped (it is meant for a file)
        typer.echo("\n".join(plain(line) for line in (md.cards_block(ev) + "\n\n" + md.results_block(ev)).splitlines()))
        return
    kind = out_format(fmt)
    if html:  # written first: a missing folder is an error before anything is printed
        page = write_html(ev, html)
    if not emit_machine(kind, ev.to_json, lambda: tabular.report_rows(ev)):
        out = console()
        out.print(evidence_answer(ev))
        if not html:  # with --html the page is the report; the terminal gets the answer and its path
            out.print(terminal_report(ev))
        # One artifact named on its own is a close look at one run: its samples come with it.
        one_file = bool(paths) and len(paths) == 1 and Path(paths[0]).is_file() and not html
        dist = samples_report(ev) if samples or one_file else None
        if dist is not None:
            out.print(dist)
    if html:
        (console() if kind == "table" else err).print(f"wrote {safe(page)}")

@guarded
def doctor_cmd(timeout: float = typer.Option(120.0, "--timeout", min=1.0, metavar="SECONDS",
                                             help="Time limit for each FlyDSL test compile (a child process).")):
    """What this machine can do: device and arch; torch, triton, FlyDSL versions; whether FlyDSL
    compiles for gfx950/gfx942 here; which reference kernels are importable; what each missing
    piece disables and how to install it.

    Example: skill-run doctor --json
    """
    from skillrun.doctor import render_lines

    with busy("checking this machine (device, libraries, a FlyDSL test compile)"):
        rep = api.doctor(flydsl_timeout_s=timeout)
    if want_json():
        emit_json(rep)
    else:
        out = console()
        for line, style in render_lines(rep):
            out.print(safe(line), style=style or None)


# What this module adds to `skill-run`, in the order `skill-run --help` lists it.
COMMANDS = (
    ("run", run_cmd, {}),
    ("check", check_cmd, {}),
    ("report", report_cmd, {}),
    ("doctor", doctor_cmd, {}),
)
