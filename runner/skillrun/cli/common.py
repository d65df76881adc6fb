"""The kit every `skill-run` command module imports: the session state that the root options set
(--kb, --json), consoles, JSON output, the failure guard, option types and help strings shared by
several commands, and the printers more than one command uses.

A command reads the knowledge base with :func:`index`, decides JSON with :func:`want_json`, prints
JSON with :func:`emit_json` and wears :func:`guarded` (one clear line and a documented exit code per
failure). Nothing here imports a command module or the entry module.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from enum import Enum
from functools import wraps
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from typer._click import exceptions as _cexc  # typer ships its own click

from skillrun import api
from skillrun.errors import EXIT_FAILURE, SkillRunError
# The version of every `--json` document printed here; skillrun.models holds it so that the API
# reading a document back (api.load_plan) checks the same number.
from skillrun.models import JSON_SCHEMA_VERSION
from skillrun.io.termtext import safe

# Set by the root callback and by the --kb/--json copies that the entry module puts on every command.
state: dict[str, Any] = {"kb": None, "json": False}


# The width output gets when stdout is not a terminal and $COLUMNS does not set one: nothing is
# wrapped or cut (the pager or the next tool wraps), so every kernel name and path stays greppable
# whole, as ripgrep, git and uv do.
UNBOUNDED = 100_000


def term_width() -> int:
    """$COLUMNS when set; else the terminal's width; when piped, :data:`UNBOUNDED`."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return max(40, int(cols))
    if sys.stdout.isatty():
        return max(40, shutil.get_terminal_size((80, 24)).columns)
    return UNBOUNDED


def unbounded(width: int) -> bool:
    """True when output is not for a terminal of a known width (print names whole, wrap nothing)."""
    return width >= UNBOUNDED


EXIT_PIPE_CLOSED = 141  # what a shell reports for a writer its reader left (128 + SIGPIPE), as `git log | head`


def stdout_closed() -> None:
    """The reader of our stdout went away (``| head``): stop quietly, no traceback, no error line.
    Later writes (the interpreter's final flush) go to /dev/null so Python does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    raise typer.Exit(EXIT_PIPE_CLOSED)


class _TrimmedLines:
    """A text stream that drops trailing spaces from every line it passes on. Unbounded (piped) output
    prints tables as wide as their widest cell, and rich pads every other row to that width: with one
    800-character kernel name, each line of a hot-kernel table carried ~800 spaces into the file."""

    def __init__(self) -> None:
        self._tail = ""
        self._prev = 0

    @property
    def _stream(self):
        # Looked up at each write, as rich does for its own default: a caller (a test runner, a
        # redirect) may swap sys.stdout after this console was made.
        return sys.stdout

    def _trim(self, line: str) -> str:
        line = line.rstrip(" ")
        # A table's header rule spans the whole (unbounded) table: cut it to the header it underlines.
        if line and not line.strip("─━═ ") and self._prev and len(line) > self._prev:
            line = line[: self._prev]
        self._prev = len(line)
        return line

    def write(self, text: str) -> int:
        lines = (self._tail + text).split("\n")
        self._tail = lines.pop()
        if lines:
            self._stream.write("".join(self._trim(line) + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self._tail:
            self._stream.write(self._tail)
            self._tail = ""
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", "utf-8")


def console(width: Optional[int] = None) -> Console:
    w = width or term_width()
    # Rich reads sys.stdout when it writes, so a test's captured stdout is honoured; wrap it only when unbounded.
    file = _TrimmedLines() if unbounded(w) else None
    c = Console(highlight=False, soft_wrap=False, width=w, markup=True, file=file)
    c.on_broken_pipe = stdout_closed  # rich would exit 1; a closed pipe is not a failure of ours
    return c


err = Console(stderr=True, highlight=False, soft_wrap=True)
out = console()  # a shared console for short messages; tables take console() per print (the width may change)


def index():
    """The knowledge base named by --kb (anywhere on the command line), else the default one."""
    return api.load_index(state["kb"])


def want_json(as_json: bool = False) -> bool:
    return bool(as_json or state["json"])


def emit_json(data: Any, key: Optional[str] = None) -> None:
    """Print one JSON document: an object that starts with ``schema_version``. A list is put under
    ``key``. A validation or e2e record printed as it is written keeps its own schema_version (the
    artifact's format, schemas/*.schema.json)."""
    # Strict JSON: NaN/Infinity (from a hostile trace or a broken timer) become null.
    from skillrun.io.strict_json import dumps

    if isinstance(data, list):
        data = {"schema_version": JSON_SCHEMA_VERSION, key or "items": data}
    elif isinstance(data, dict) and "schema_version" not in data:
        data = {"schema_version": JSON_SCHEMA_VERSION, **data}
    sys.stdout.write(dumps(data, indent=2) + "\n")


def exit_on_card_problems(problems) -> None:
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
            try:
                return fn(*a, **kw)
            finally:
                sys.stdout.flush()  # a reader that left (`| head`) is met here, not at the interpreter's exit
        except (typer.Exit, _cexc.UsageError):
            raise
        except SkillRunError as exc:
            err.print(f"[bold red]error:[/] {safe(exc)}", markup=True, highlight=False)
            # Kept for the JSON error object a failing --json call prints (entry.main).
            state["error"] = {"reason": exc.reason, "path": exc.path, "field": exc.field, "hint": exc.hint,
                              "exit_code": exc.exit_code}
            raise typer.Exit(exc.exit_code)
        except KeyboardInterrupt:
            err.print("interrupted")
            state["error"] = {"reason": "interrupted", "exit_code": 130}
            raise typer.Exit(130)
        except BrokenPipeError:
            stdout_closed()
        except Exception as exc:  # noqa: BLE001 - the last line of defence for users
            if os.environ.get("SKILLRUN_DEBUG"):
                raise
            err.print(f"[bold red]internal error:[/] {safe(type(exc).__name__)}: {safe(exc)} (set SKILLRUN_DEBUG=1 for a traceback)")
            state["error"] = {"reason": f"internal error: {type(exc).__name__}: {exc}", "exit_code": EXIT_FAILURE}
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


# `profile` and `e2e` take a workload's command line: their options end at its first word, so
# `skill-run profile python x.py --steps 3` hands `--steps 3` to x.py (`--` works as well).
WORKLOAD_COMMAND = {"allow_interspersed_args": False}

ARCH_HELP = "Device arch when the trace does not say: gfx950, gfx942, gfx90a, sm_90, sm_100, … (a typo is an error)."
TARGET_ARCH_HELP = ("Arch to select recipes and compile for, when it is not the device present: gfx950, gfx942, sm_90, … "
                    "(a typo is an error).")
TOP_HELP = "How many hot kernels to rank and match (at least 1)."
SHAPE_HELP = "Shape for kernels whose shape the trace lacks, in the card's key order, e.g. 4096,2048,7168 (repeatable)."
WIDE_HELP = "Print kernel names whole (the table grows wider than the terminal; always so when piped)."
FORMAT_HELP = "Output format: table (default), csv, tsv (one row per record, header first) or json (as --json)."


class OutFormat(str, Enum):
    table = "table"
    csv = "csv"
    tsv = "tsv"
    json = "json"


def out_format(fmt: "OutFormat | None") -> str:
    """The format a command prints in: --json (anywhere) wins, else --format, else table."""
    if want_json():
        return "json"
    return fmt.value if fmt is not None else "table"


def emit_rows(rows: "tuple[list[str], list[dict]]", fmt: str) -> None:
    from skillrun.output.tabular import write

    columns, records = rows
    write(columns, records, fmt, sys.stdout)


def emit_machine(kind: str, data, rows, key: Optional[str] = None) -> bool:
    """The machine-readable views: for --json print ``data()`` (a list under ``key``), for --format
    csv|tsv the table file of ``rows()``, and return True; False when the human view is wanted
    (neither is built then)."""
    if kind == "json":
        emit_json(data(), key)
        return True
    if kind in ("csv", "tsv"):
        emit_rows(rows(), kind)
        return True
    return False


def attach(app: typer.Typer, commands) -> None:
    """Add a command module's ``COMMANDS`` ((name, function, typer settings), …) to ``app`` in order."""
    for name, fn, settings in commands:
        app.command(name, **settings)(fn)


# --------------------------------------------------------------------------- shared printers
def devices_label(p) -> str:
    names = [d.name or d.arch or "?" for d in p.devices]
    if not names:
        return "unknown device"
    if len(set(names)) == 1:
        return (f"{len(names)}× " if len(names) > 1 else "") + names[0]
    return ", ".join(names)


def print_analysis(a: "api.Analysis", top: int, wide: bool = False, verbose: bool = True, answer: bool = True) -> None:
    """The answer line first, then the profile, the hot kernels, the matches (each criterion with
    its reason only when ``verbose``: `match` and `-v`) and the plan."""
    from skillrun.analysis.hot_table import breakdown_lines, hot_kernels, render
    from skillrun.plan.planner import answer_line

    width = term_width()
    wide = wide or unbounded(width)
    out = console(width)
    p = a.profile
    if answer:
        out.print(answer_line(a.plan, len({m.skill_id for m in a.matches.matches}), str(p.source)))
    out.print(f"[bold]{safe(Path(p.source).name)}[/]  format={p.format}  arch={safe(p.arch or 'unknown')}  ({safe(devices_label(p))})")
    out.print(f"GPU kernel time {p.total_kernel_us / 1e3:.3f} ms over {p.kernel_calls} kernel calls; "
              f"{p.linked_calls} calls linked to an op with shapes; shape unknown for {p.unattributed_us / 1e3:.3f} ms"
              + (f"; graph replay: {p.graph_replay.kernel_calls} kernel calls from {p.graph_replay.launches} graph launches" if p.graph_replay.detected else ""))
    for w in p.warnings:
        out.print(f"[yellow]warning:[/] {safe(w)}")
    data = hot_kernels(p, top)
    for line in breakdown_lines(data, with_total=False):  # the line above has the total
        out.print(safe(line))
    table = render(data, width, wide=wide, title=f"Hot kernels (top {min(top, len(p.kernels))} of {len(p.kernels)})")
    if wide:
        console(max(width, 10_000)).print(table, crop=False)
    else:
        out.print(table)

    m = a.matches
    if m.communication:
        out.print(f"[dim]{len(m.communication)} communication kernel(s) (NCCL/RCCL) are listed but not offered to cards.[/]")
    if not m.matches:
        out.print("[bold yellow]No skill card matches a hot kernel of this profile.[/]")
    for res in m.matches + m.near_misses:
        tag = "[green]MATCH[/]" if res.matched else "[yellow]near miss[/]"
        name = res.kernel if wide or len(res.kernel) <= 100 else res.kernel[:99] + "…"
        out.print(f"{tag} [bold]{safe(res.skill_id)}[/] ← {safe(name)} ({res.pct_gpu:.2f}% GPU)")
        # A near miss always says which criterion failed; every criterion with -v or `match`.
        for c in res.criteria if verbose else [c for c in res.criteria if c.passed is False and c.required]:
            if c.passed is None:  # the trace cannot answer it: neither a tick nor a cross
                out.print(f"    [dim]–[/] {safe(c.name)}: [dim]not checked[/]: {safe(c.reason)}")
                continue
            mark = "[green]✓[/]" if c.passed else "[red]✗[/]"
            out.print(f"    {mark} {safe(c.name)}: {safe(c.reason)}" + ("" if c.required else " [dim](informational)[/]"))
    if not verbose and (m.matches or m.near_misses):
        out.print("[dim]every match criterion with its reason: add -v, or `skill-run match TRACE`[/]")

    from skillrun.plan.planner import plan_lines

    for line in plan_lines(a.plan):
        out.print(line)


def print_results(results: list[dict], answer: bool = True) -> None:
    from skillrun.output.report import report_table, results_answer

    out = console()
    if answer:
        out.print(results_answer(results))
    out.print(report_table(results))
    for r in results:
        if r.get("artifact"):
            out.print(f"wrote {safe(r['artifact'])}")
    report_unwritten(results)


def report_unwritten(results: list[dict]) -> None:
    """Runs whose artifact could not be written: the verdict stands (printed or in the JSON), the
    cause goes to stderr."""
    for r in results or []:
        if r.get("artifact_error"):
            err.print(f"[bold red]error:[/] the result above was not saved: {safe(r['artifact_error'])}", highlight=False)


def exit_if_unwritten(results: list[dict] | None) -> None:
    if results and any(r.get("artifact_error") for r in results):
        raise typer.Exit(EXIT_FAILURE)



class busy:
    """A spinner with the elapsed time on stderr while a long step runs (doctor, check, tune, ablate),
    only when stderr is a terminal; a pipe or a log gets nothing. On exit it prints what finished
    and how long it took, so a 40-second compile is never a blank screen."""

    def __init__(self, what: str, stream: Optional[Console] = None):
        self.what, self.console, self.status, self.t0 = what, stream or err, None, 0.0

    def __enter__(self) -> "busy":
        import time

        if self.console.is_terminal:
            from rich.status import Status

            self.t0 = time.monotonic()
            self.status = Status(f"{safe(self.what)} …", console=self.console)
            self.status.start()
        return self

    def __exit__(self, *exc) -> None:
        import time

        if self.status is not None:
            self.status.stop()
            self.console.print(f"[dim]{safe(self.what)}: {time.monotonic() - self.t0:.1f} s[/]", highlight=False)


class ItemProgress:
    """Item-by-item progress of runs on stderr, only when stderr is a terminal: a live line for the
    item running (with its elapsed time), and one line per finished item with its verdict and time,
    followed by an estimate of the time left once an item has finished.
    Use as ``with ItemProgress() as on_item: api.execute(..., on_item=on_item)``."""

    def __init__(self, stream: Optional[Console] = None, clock: Optional[Callable[[], float]] = None):
        import time

        self.console = stream or err
        self.clock = clock or time.monotonic  # injectable so the estimate is testable without sleeping
        self.live = None
        self.t0 = 0.0
        self.durations: list[float] = []

    def __enter__(self):
        return self if self.console.is_terminal else None

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def time_left(self, done: int, n: int) -> Optional[float]:
        """Seconds left for the n - done items not finished, from the mean time of the items finished
        so far; None before any has finished (a guess from nothing would only mislead)."""
        if not self.durations or done >= n:
            return None
        return sum(self.durations) / len(self.durations) * (n - done)

    def _left_words(self, done: int, n: int) -> str:
        left = self.time_left(done, n)
        return "" if left is None else f"about {_seconds(left)} left (estimate)"

    def __call__(self, event: str, i: int, n: int, item: Any, result: Optional[dict] = None) -> None:
        from rich.status import Status

        from skillrun.evidence.verdict import verdict_style

        shape = ",".join(f"{k}={v}" for k, v in (getattr(item, "shape", None) or {}).items())
        what = f"[{i + 1}/{n}] {safe(item.skill_id)} {safe(shape)}"
        if event == "start":
            self.t0 = self.clock()
            left = self._left_words(i, n)
            self.live = Status(f"running {what} …" + (f" [dim]({left})[/]" if left else ""), console=self.console)
            self.live.start()
            return
        if self.live is not None:
            self.live.stop()
            self.live = None
        took = self.clock() - self.t0
        self.durations.append(took)
        v = str((result or {}).get("verdict") or "—")
        sp = (result or {}).get("speedup")
        style = verdict_style(v)
        word = f"[{style}]{safe(v)}[/]" if style else safe(v)
        left = self._left_words(i + 1, n)
        self.console.print(f"{what}: {word}" + (f" {sp:.3f}×" if isinstance(sp, (int, float)) else "")
                           + f" [dim]({took:.1f} s" + (f"; {left}" if left else "") + ")[/]", highlight=False)


def _seconds(s: float) -> str:
    """A duration as a person reads it: under 1 s, 45 s, 3 min 20 s, 1 h 05 min."""
    if s < 0.5:
        return "under 1 s"
    s = round(s)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


# --------------------------------------------------------------------------- runs without a GPU
def command_line() -> str:
    return " ".join(["skill-run", *sys.argv[1:]])


def gpu_present() -> bool:
    from skillrun.execute.backends import detect_facts

    return detect_facts(None).kind != "cpu"


def cpu_fallback(backend: Optional[str]) -> tuple[Optional[str], bool]:
    """(backend to run with, whether the user asked for CPU numerics).

    A run that needs a GPU is refused here, before anything is computed or written (exit 5), when
    this machine has none: no --backend, or --backend cuda/rocm. Only --backend cpu runs without one.
    """
    if backend == "cpu":
        return backend, True
    if gpu_present():
        return backend, False
    from skillrun.errors import UnavailableError

    raise UnavailableError(
        "no GPU on this machine, so nothing was run: timing a port against its references needs one",
        hint="--backend cpu checks CPU numerics of the port on a small proxy shape (no timing, no speedup); "
             "`skill-run check CARD` runs the FlyDSL compile-only gates; or run this on a machine with a GPU")


def cpu_note(results: list[dict]) -> None:
    """What --backend cpu measured (a run without a GPU is refused by cpu_fallback before any work)."""
    proxies = sorted({json.dumps(r.get("proxy_shape")) for r in results if r.get("proxy_shape")})
    msg = ("no GPU was used: this measured CPU numerics of the port on a small proxy shape"
           + (f" ({', '.join(proxies)})" if proxies else "") + "; there is no timing and no speedup")
    err.print(f"[yellow]note:[/] {safe(msg)}")
