"""`skill-run`: the entry module. It builds the root app, attaches every command module in the order
`skill-run --help` lists them, and gives each command --kb and --json (before or after the command
word), flag-style help and exit codes. Commands are thin typer functions over :mod:`skillrun.api`;
they import the shared kit :mod:`skillrun.cli.common`, never this module, and nothing else imports it
(the `skill-run` script reaches :func:`main` through :func:`skillrun.cli.main`).

A new command: a function in its group's module, listed in that module's ``COMMANDS``. A
command that prints JSON declares ``as_json: bool = typer.Option(False, "--json", …)`` (that parameter
name: ``skill-run --json NAME`` sets it) or reads :func:`~skillrun.cli.common.want_json`; it reads the
knowledge base with :func:`~skillrun.cli.common.index`.
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Optional

import typer
from typer._click import exceptions as _cexc  # typer ships its own click
from typer.core import TyperGroup

from skillrun.cli import agent, analyze, e2e, kb, profile, run, tune
from skillrun.cli.common import attach, err, state
from skillrun.io.termtext import plain

HELP = """Read a GPU profile, rank its hot kernels, match expert skill cards and pick a recipe per shape; `--run` also runs each port against its production reference and writes validation YAML.

Example: skill-run --profile trace.json.gz (torch.profiler, rocprofv3, rocpd, nsys, ncu; detected from content)

Exit codes: 0 ok · 1 a problem found (lint errors, failed gate, parity failure) · 2 usage error · 3 unreadable or corrupt input file · 4 no card matched the profile · 5 backend, device or tool unavailable. Set SKILLRUN_DEBUG=1 for tracebacks."""

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


app.callback(invoke_without_command=True)(analyze.main_cmd)  # skill-run --profile TRACE
# The order here is the order of `skill-run --help`.
for _module in (analyze, kb, run, profile, agent, tune, e2e):
    attach(app, _module.COMMANDS)

# `skill-run -h` lists commands by what they are for, not in one flat list of 17.
PANELS = {
    "Analyse a trace": ("match", "plan", "kernels", "profile"),
    "Cards": ("list", "show", "fact", "lint"),
    "Run and check ports": ("run", "check", "tune", "ablate", "e2e"),
    "Evidence": ("report",),
    "Setup": ("doctor",),
    "Agents": ("agent", "mcp"),
}
_panel_of = {name: panel for panel, names in PANELS.items() for name in names}
_order = [n for names in PANELS.values() for n in names]
for _info in app.registered_commands:
    _info.rich_help_panel = _panel_of.get(_info.name or "", "Other")
app.registered_commands.sort(key=lambda c: _order.index(c.name) if c.name in _order else len(_order))


def _set_json(ctx, param, value):
    if value:
        state["json"] = True
    return value


def _set_kb(ctx, param, value):
    if value:
        state["kb"] = Path(value)
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
    """The click group behind `skill-run`, with every command given --kb and --json and tidy help."""
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
        if sub.help:
            # Docstrings wrap at 120 columns in the source; help re-wraps each paragraph to the terminal
            # (rich keeps hard newlines, which broke lines mid-sentence).
            sub.help = "\n\n".join(" ".join(par.split()) for par in inspect.cleandoc(sub.help).split("\n\n"))
            sub.short_help = sub.help.split("\n\n")[0]
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
    known = state.get("error")
    if known:
        return {"error": {k: v for k, v in known.items() if v is not None}}
    # Failures reported with a message and an exit (no exception): the last line written to stderr.
    lines = [ln.strip() for ln in err.export_text(clear=False).splitlines() if ln.strip()]
    reason = lines[-1] if lines else f"failed with exit code {code}"
    if reason.startswith("error:"):
        reason = reason[len("error:"):].strip()
    return {"error": {"reason": reason, "exit_code": code}}


def _on_sigterm(signum, frame) -> None:
    # Unwind like Ctrl-C does (finally blocks, atexit): temporary folders are removed and helper
    # processes stopped, where the default action would end the process on the spot.
    raise SystemExit(128 + signum)


def main() -> None:
    """`skill-run`. With --json, every failure also prints one JSON error object on stdout (unless
    the command already printed its JSON, which then carries the result)."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, _on_sigterm)
    args = sys.argv[1:]
    wants_json = "--json" in (args[: args.index("--")] if "--" in args else args)
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
        state["error"] = {"reason": exc.format_message(), "exit_code": rc}
    except _cexc.Abort:
        err.print("aborted")
        rc = 130
    code = rc if isinstance(rc, int) and not isinstance(rc, bool) else 0
    if code and not watched.wrote:
        from skillrun.io.strict_json import dumps

        watched.write(dumps(_json_error_object(code), indent=2) + "\n")
    sys.stdout.flush()
    sys.exit(code)

