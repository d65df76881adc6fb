"""`skill-run profile`: profile a workload, then analyse the trace like `skill-run --profile`.

    skill-run profile --out trace.json -- python bench.py --batch 8
    skill-run profile --steps 5:8 -- python train.py        # keep iterations 5, 6, 7 (skillrun.profiling.step())
    skill-run profile --region -- python serve.py           # keep `with skillrun.profiling.region(...)` blocks
    skill-run profile --tool rocprofv3 --out k.csv -- python bench.py
"""
from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from skillrun.cli.common import WORKLOAD_COMMAND, emit_json, err, guarded, index, out, print_analysis
from skillrun.errors import EXIT_NO_MATCH

HELP = ("Run a workload under a profiler without editing it, then rank and match its hot kernels "
        "(like `skill-run --profile`).\n\n" + "\n".join(line.strip() for line in __doc__.splitlines()[2:]))


class Tool(str, Enum):
    torch = "torch"
    rocprofv3 = "rocprofv3"
    nsys = "nsys"


@guarded
def profile_cmd(
    command: List[str] = typer.Argument(..., metavar="-- COMMAND...", help="The workload to run, e.g. python bench.py."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="Trace to write (.gz compresses). Default: "
                                            "trace.json (torch), trace.csv (rocprofv3; .json/.db pick that format), trace.sqlite (nsys)."),
    steps: Optional[str] = typer.Option(None, "--steps", help="Keep profiler steps a:b (a..b-1; `a:`, `:b`, `n` too); a step "
                                        "ends at each skillrun.profiling.step() call."),
    region: bool = typer.Option(False, "--region", help="Profile only inside `with skillrun.profiling.region(name):` blocks."),
    tool: Tool = typer.Option(Tool.torch, "--tool", help="torch (injected torch.profiler) | rocprofv3 | nsys."),
    activities: str = typer.Option("auto", "--activities", help="torch.profiler activities: auto (cpu + cuda when this torch "
                                   "build supports it) or a comma list of cpu,cuda."),
    no_analyze: bool = typer.Option(False, "--no-analyze", help="Only write the trace; skip ranking and matching."),
    arch: Optional[str] = typer.Option(None, "--arch", help="Device arch (gfx950, gfx942, sm_90) when the trace does not say."),
    top: int = typer.Option(20, "--top", help="How many hot kernels to rank and match."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables (the workload's stdout goes to stderr)."),
):
    """Run a workload under a profiler without editing it, then rank and match its hot kernels."""
    from skillrun.api import analyze
    from skillrun.profiling.run import DEFAULT_OUT, profile_workload

    target = out_path or Path(DEFAULT_OUT[tool.value])
    # Under --json our stdout must stay pure JSON, so the workload prints to stderr instead.
    trace = profile_workload(list(command), target, steps=steps, region=region, tool=tool.value,
                             activities=activities, stdout=2 if as_json else None)
    if no_analyze:
        if as_json:
            emit_json({"trace": str(trace)})
        else:
            out.print(f"wrote {trace}")
        return
    if not as_json:
        err.print(f"wrote {trace}; analysing it")
    sys.stdout.flush()
    a = analyze(trace, index=index(), arch=arch, top=top)
    if as_json:
        data = a.to_json(top)
        data["trace"] = str(trace)
        emit_json(data)
    else:
        print_analysis(a, top)
    if not a.matches.matches:
        raise typer.Exit(EXIT_NO_MATCH)


# What this module adds to `skill-run`, in the order `skill-run --help` lists it.
COMMANDS = (
    ("profile", profile_cmd, {"context_settings": WORKLOAD_COMMAND, "help": HELP}),
)
