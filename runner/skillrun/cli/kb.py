"""`skill-run lint`, `list`, `show` and `fact`: read and check the knowledge base."""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from skillrun import api
from skillrun.output import tabular
from skillrun.cli.common import (FORMAT_HELP, OutFormat, console, emit_json, emit_machine, err, exit_on_card_problems, guarded,
                                 index, out_format, term_width, unbounded, want_json)
from skillrun.errors import EXIT_FAILURE
from skillrun.io.termtext import plain_block, safe


@guarded
def lint_cmd():
    """Validate every card, fact and validation artifact; run each card's own test cases.

    Example: skill-run lint --kb ./my-kb
    """
    rep = api.lint_kb(index())
    if want_json():
        emit_json(rep.to_json())
    else:
        for e in rep.errors:
            err.print(f"[red]✗[/] {safe(e)}", highlight=False)
        for w in rep.warnings:
            err.print(f"[yellow]warning:[/] {safe(w)}", highlight=False)
        c = rep.checked
        from skillrun.evidence.inventory import counts_text

        msg = (f"{c.get('skills', 0)} skills, {c.get('facts', 0)} facts, "
               + counts_text({"validation_artifacts": c.get("artifacts", 0), "e2e_records": c.get("e2e_records", 0),
                              "tuning_artifacts": c.get("tuning_artifacts", 0)}) + " checked")
        if rep.warnings:
            msg += f"; {len(rep.warnings)} warning(s) above"
        console().print(("[green]lint ok:[/] " if rep.ok else f"[red]lint failed ({len(rep.errors)} errors):[/] ") + msg)
    if not rep.ok:
        raise typer.Exit(EXIT_FAILURE)


@guarded
def list_cmd(fmt: Optional[OutFormat] = typer.Option(None, "--format", help=FORMAT_HELP)):
    """List skill cards: id, device generations, what they port from and to, recipes, validation status.

    Example: skill-run list --json
    """
    from rich.text import Text

    from skillrun.evidence.verdict import CARD_STATUSES, TONE_STYLE

    idx = index()
    # The validation status comes from the evidence (api.list_cards): a card that claims validation
    # while every GPU artifact of it is stale reads `stale`, never `validated`.
    rows = [{**r, "from": r["from_backend"], "to": r["to_backend"]} for r in api.list_cards(idx)]
    if emit_machine(out_format(fmt), lambda: rows, lambda: tabular.card_rows(rows), key="cards"):
        exit_on_card_problems(idx.problems)  # an invalid card is never dropped silently
        return
    import textwrap

    from rich import box

    width = term_width()
    t = Table(title=f"Skill cards ({safe(idx.root)})", box=box.SIMPLE_HEAD, title_justify="left")
    # A card id is what `skill-run show` takes: never wrapped, so it can be copied whole. The rest
    # wraps between words; below 110 columns it goes on dim lines under the id, wrapped to fit.
    stacked = not unbounded(width) and width < 110
    t.add_column("id" + (" · gens · from → to · recipes" if stacked else ""), no_wrap=True,
                 min_width=max((len(r["id"]) for r in rows), default=2))
    if not stacked:
        for col in ("gens", "from → to", "recipes"):
            t.add_column(col, overflow="fold", ratio=3 if col == "recipes" else 1)
    t.add_column("validation", overflow="fold", ratio=1, min_width=12)
    for r in rows:
        frm = r["from"] if isinstance(r["from"], str) else "/".join(r["from"])
        status = Text(safe(r["validation"]), style=TONE_STYLE[CARD_STATUSES.get(r["validation"], ("neutral", ""))[0]])
        if r["validation_note"]:
            status.append("\n" + safe(r["validation_note"]), style="dim")
        gens, moves, recipes = ", ".join(r["gens"]), f"{frm} → {r['to']}", ", ".join(r["recipes"])
        if stacked:
            cell = Text(safe(r["id"]))
            room = max(20, width - 20)
            for ln in [f"{gens} · {moves}"] + textwrap.wrap("recipes: " + recipes, room - 2, break_on_hyphens=False):
                cell.append("\n  " + safe(ln), style="dim")
            t.add_row(cell, status)
        else:
            t.add_row(safe(r["id"]), safe(gens), safe(moves), safe(recipes), status)
    console().print(t)
    exit_on_card_problems(idx.problems)


@guarded
def show_cmd(skill_id: str = typer.Argument(..., metavar="CARD", help="Card id, as `skill-run list` prints it.")):
    """Print one card: match signature, recipes, body (front matter as data with --json).

    Example: skill-run show flydsl_fp8_blockscale_gemm
    """
    card = index().skill(skill_id)
    _print_card(card, [f"gens {safe(card.gens)}  regex /{safe(card.regex)}/  min % GPU {card.min_pct_gpu}"]
                + [f"  recipe [bold]{safe(r.name)}[/] when `{safe(r.when)}` → {safe(r.kernel)} {safe(json.dumps(r.config))}"
                   for r in card.recipes])


@guarded
def fact_cmd(fact_id: str = typer.Argument(..., metavar="FACT", help="Fact id, as a card's `facts` list names it.")):
    """Print one fact card.

    Example: skill-run fact gfx950_hardware
    """
    _print_card(index().fact(fact_id), [])


def _print_card(card, lines: list[str]) -> None:
    """A skill or fact card: its front matter as data with --json, else title, ``lines`` and its body."""
    if want_json():
        emit_json(card.to_json())
        return
    from rich.markdown import Markdown

    out = console()
    out.print(f"[bold]{safe(card.id)}[/] — {safe(card.data['title'])}")
    for line in lines:
        out.print(line)
    # Card text is untrusted: raw escapes are made visible and links printed as text (no OSC-8).
    out.print(Markdown(plain_block(card.body), hyperlinks=False))


# What this module adds to `skill-run`, in the order `skill-run --help` lists it.
COMMANDS = (
    ("lint", lint_cmd, {}),
    ("list", list_cmd, {}),
    ("show", show_cmd, {}),
    ("fact", fact_cmd, {}),
)
