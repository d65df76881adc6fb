"""`skill-run tune` and `skill-run ablate`: thin typer commands over :func:`skillrun.api.tune` / ``ablate``.

    skill-run tune triton_fp8_rowwise_batched_gemm_sm90 --shape 16,2048,8192,1024
    skill-run tune --from-plan trace.json                       # every UNTUNED item of the plan
    skill-run tune flydsl_fp8_blockscale_gemm --shape 4096,4096,1536 --compile-only --arch gfx950
    skill-run ablate flydsl_fp8_blockscale_gemm --shape 4096,65536,1536 --set xcd_swizzle=0
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from skillrun.errors import EXIT_FAILURE


def _resources(items: list[str] | None) -> dict[str, float] | None:
    from skillrun.errors import UsageError

    if not items:
        return None
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        try:
            out[k] = float(v)
        except ValueError:
            sep = ""
        if not sep or not k:
            raise UsageError(f"--ray-resource {it!r} is not NAME=AMOUNT", field="ray_resource")
    return out


def register(app: typer.Typer) -> None:
    from skillrun import api
    from skillrun.cli import _command_line, _emit_json, _index, guarded, out

    @app.command("tune")
    @guarded
    def tune_cmd(skill_id: Optional[str] = typer.Argument(None, help="Card id (omit with --from-plan)."),
                 shape: Optional[List[str]] = typer.Option(None, "--shape", help="Shape(s) in the problem's key order."),
                 from_plan: Optional[Path] = typer.Option(None, "--from-plan", help="Tune every UNTUNED item of this trace's plan."),
                 backend: Optional[str] = typer.Option(None, "--backend", help="cuda | rocm | cpu (default: the device present)."),
                 rounds: int = typer.Option(100, "--rounds", help="Interleaved rounds per sweep session."),
                 recheck_rounds: Optional[int] = typer.Option(None, "--recheck-rounds", help="Rounds of the final re-check (default: --rounds)."),
                 top: int = typer.Option(3, "--top", help="Finalists re-timed against the incumbent and the baseline."),
                 seeds: int = typer.Option(3, "--seeds"), timeout: float = typer.Option(600.0, "--timeout", help="Seconds per candidate task."),
                 workers: Optional[int] = typer.Option(None, "--workers", help="Local workers (default: one per visible GPU)."),
                 ray: Optional[str] = typer.Option(None, "--ray", help="Ray cluster address ('local' starts one here)."),
                 ray_resource: Optional[List[str]] = typer.Option(None, "--ray-resource", help="NAME=AMOUNT per Ray task (besides num_gpus)."),
                 compile_only: bool = typer.Option(False, "--compile-only", help="FlyDSL: prune the space on the CPU by the static gates."),
                 arch: Optional[str] = typer.Option(None, "--arch"),
                 start_from: Optional[Path] = typer.Option(None, "--start-from", help="A compile_prune artifact: sweep only the configs it kept."),
                 apply: bool = typer.Option(False, "--apply", help="Write the proposed recipe into SKILL.md (lint must pass)."),
                 cuda_graph: bool = typer.Option(False, "--cuda-graph"),
                 cold_l2: str = typer.Option("rotate", "--cold-l2", help="rotate | flush | off"),
                 timer: Optional[str] = typer.Option(None, "--timer", help="event | wall | module:factory (default: device events on a GPU, none on the CPU)."),
                 as_json: bool = typer.Option(False, "--json"),
                 no_write: bool = typer.Option(False, "--no-write", help="Write no artifact (and so propose no diff).")):
        """Sweep a recipe's declared space from the nearest recipe; propose a recipe only if it beats the incumbent beyond noise."""
        results = api.tune(_index(), skill_id, shape, from_plan=from_plan, backend=backend, rounds=rounds,
                           recheck_rounds=recheck_rounds, top=top, seeds=seeds, timeout_s=timeout, workers=workers,
                           ray_address=ray, ray_resources=_resources(ray_resource), compile_only=compile_only, arch=arch,
                           start_from=start_from, apply=apply, cuda_graph=cuda_graph, cold_l2=cold_l2, timer=timer,
                           write=not no_write, command=_command_line())
        if as_json:
            _emit_json(results)
        else:
            for r in results:
                _print_tuning(out, r)
            if not results:
                out.print("the plan has no UNTUNED item with a known shape: nothing to tune")
        if any(r.get("verdict") in ("error", "incumbent_failed", "no_survivor") for r in results):
            raise typer.Exit(EXIT_FAILURE)

    @app.command("ablate")
    @guarded
    def ablate_cmd(skill_id: str, shape: str = typer.Option(..., "--shape"),
                   set_: List[str] = typer.Option(..., "--set", help="knob=value on the recipe's config (repeatable)."),
                   recipe: Optional[str] = typer.Option(None, "--recipe", help="Ablate this recipe (default: the one selected for the shape)."),
                   backend: Optional[str] = typer.Option(None, "--backend"), rounds: int = typer.Option(200, "--rounds"),
                   seeds: int = typer.Option(3, "--seeds"), timeout: float = typer.Option(600.0, "--timeout"),
                   arch: Optional[str] = typer.Option(None, "--arch"), cuda_graph: bool = typer.Option(False, "--cuda-graph"),
                   cold_l2: str = typer.Option("rotate", "--cold-l2"),
                   timer: Optional[str] = typer.Option(None, "--timer", help="event | wall | module:factory"), as_json: bool = typer.Option(False, "--json"),
                   no_write: bool = typer.Option(False, "--no-write")):
        """Same-session A/B of a recipe against itself with a lever changed: load-bearing or not, and does the card agree."""
        r = api.ablate(_index(), skill_id, shape, set_, recipe=recipe, backend=backend, rounds=rounds, seeds=seeds,
                       timeout_s=timeout, arch=arch, cuda_graph=cuda_graph, cold_l2=cold_l2, timer=timer, write=not no_write,
                       command=_command_line())
        if as_json:
            _emit_json(r)
        else:
            _print_tuning(out, r)
        if r["verdict"] in ("error", "incumbent_failed") or (r.get("ablation") or {}).get("agrees_with_card") is False:
            raise typer.Exit(EXIT_FAILURE)


def _print_tuning(out, r: dict) -> None:
    from rich.table import Table

    card = (r.get("card") or {}).get("id")
    out.print(f"[bold]{card}[/] {r.get('kind', '')} {r.get('shape')}: [bold]{r.get('verdict')}[/] - {r.get('reason')}")
    rows = r.get("candidates") or []
    if rows:
        t = Table(show_edge=False)
        for c in ("id", "config change", "status", "sweep x", "re-check x", "reason"):
            t.add_column(c, overflow="fold")
        for c in rows:
            sw = (c.get("sweep") or {}).get("speedup_vs_incumbent")
            rc = (c.get("recheck") or {}).get("speedup_vs_incumbent")
            t.add_row(c["id"], c.get("label", ""), c["status"], f"{sw:.3f}" if sw else "-", f"{rc:.3f}" if rc else "-",
                      str(c.get("reason", ""))[:120])
        out.print(t)
    if r.get("artifact"):
        out.print(f"artifact: {r['artifact']}")
    if r.get("diff"):
        out.print("proposed card change" + (" (applied):" if (r.get("proposal") or {}).get("applied") else " (not applied; --apply writes it):"))
        out.print(r["diff"], markup=False, highlight=False)
