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

from skillrun import api
from skillrun.cli.common import TARGET_ARCH_HELP, Backend, ColdL2, busy, command_line, emit_json, guarded, index, out, want_json
from skillrun.errors import EXIT_FAILURE
from skillrun.options import check_arch


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


@guarded
def tune_cmd(skill_id: Optional[str] = typer.Argument(None, metavar="CARD", help="Card id (omit with --from-plan)."),
             shape: Optional[List[str]] = typer.Option(None, "--shape", metavar="SHAPE", help="Shape(s) in the card's key order (repeatable)."),
             from_plan: Optional[Path] = typer.Option(None, "--from-plan", metavar="TRACE", help="Tune every UNTUNED item of this trace's plan."),
             backend: Optional[Backend] = typer.Option(None, "--backend", help="Where to run (default: the device present)."),
             rounds: int = typer.Option(100, "--rounds", min=1, metavar="N", help="Interleaved rounds per sweep session (at least 1)."),
             recheck_rounds: Optional[int] = typer.Option(None, "--recheck-rounds", min=1, metavar="N", help="Rounds of the final re-check (default: --rounds)."),
             top: int = typer.Option(3, "--top", min=1, metavar="N", help="Finalists re-timed against the incumbent and the baseline."),
             seeds: int = typer.Option(3, "--seeds", min=1, metavar="N", help="Fresh random input sets for each candidate's parity gate (at least 1)."),
             timeout: float = typer.Option(600.0, "--timeout", min=1.0, metavar="SECONDS", help="Seconds per candidate task."),
             workers: Optional[int] = typer.Option(None, "--workers", min=1, metavar="N", help="Local workers (default: one per visible GPU)."),
             ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS", help="Ray cluster address ('local' starts one here)."),
             ray_resource: Optional[List[str]] = typer.Option(None, "--ray-resource", metavar="NAME=AMOUNT", help="A custom resource each Ray task asks for (besides num_gpus; repeatable)."),
             compile_only: bool = typer.Option(False, "--compile-only", help="FlyDSL: prune the space on the CPU by the static gates."),
             arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=TARGET_ARCH_HELP),
             start_from: Optional[Path] = typer.Option(None, "--start-from", metavar="ARTIFACT", help="A compile_prune artifact: sweep only the configs it kept."),
             apply: bool = typer.Option(False, "--apply", help="Write the proposed recipe into SKILL.md (lint must pass)."),
             cuda_graph: bool = typer.Option(False, "--cuda-graph", help="Time CUDA-graph replays instead of eager launches."),
             cold_l2: ColdL2 = typer.Option(ColdL2.rotate, "--cold-l2", help="Keep L2 cold by rotating input sets, by a flush kernel, or not at all."),
             timer: Optional[str] = typer.Option(None, "--timer", metavar="TIMER", help="event | wall | module:factory (default: device events on a GPU, none on the CPU)."),
             no_write: bool = typer.Option(False, "--no-write", help="Write no artifact (and so propose no diff).")):
    """Sweep a recipe's declared space from the nearest recipe; propose a recipe only if it beats the incumbent beyond noise.

    Example: skill-run tune triton_fp8_rowwise_batched_gemm_sm90 --shape 16,8192,8192,1024 --cuda-graph --apply
    """
    with busy("tuning " + (skill_id or "the plan's untuned items") + (" (compile-only)" if compile_only else "")):
        results = api.tune(index(), skill_id, shape, from_plan=from_plan, backend=backend.value if backend else None,
                           rounds=rounds, recheck_rounds=recheck_rounds, top=top, seeds=seeds, timeout_s=timeout,
                           workers=workers, ray_address=ray, ray_resources=_resources(ray_resource), compile_only=compile_only,
                           arch=check_arch(arch), start_from=start_from, apply=apply, cuda_graph=cuda_graph,
                           cold_l2=cold_l2.value, timer=timer, write=not no_write, command=command_line())
    if want_json():
        emit_json(results, "results")
    else:
        for r in results:
            _print_tuning(out, r)
        if not results:
            out.print("the plan has no UNTUNED item with a known shape: nothing to tune")
    if any(r.get("verdict") in ("error", "incumbent_failed", "no_survivor") for r in results):
        raise typer.Exit(EXIT_FAILURE)


@guarded
def ablate_cmd(skill_id: str = typer.Argument(..., metavar="CARD", help="Card id whose recipe to ablate."),
               shape: str = typer.Option(..., "--shape", metavar="SHAPE", help="The shape, in the card's key order."),
               set_: List[str] = typer.Option(..., "--set", metavar="KNOB=VALUE", help="knob=value on the recipe's config (repeatable)."),
               recipe: Optional[str] = typer.Option(None, "--recipe", metavar="NAME", help="Ablate this recipe (default: the one selected for the shape)."),
               backend: Optional[Backend] = typer.Option(None, "--backend", help="Where to run (default: the device present)."),
               rounds: int = typer.Option(200, "--rounds", min=1, metavar="N", help="Interleaved A/B rounds (at least 1)."),
               seeds: int = typer.Option(3, "--seeds", min=1, metavar="N", help="Fresh random input sets for the parity gate (at least 1)."),
               timeout: float = typer.Option(600.0, "--timeout", min=1.0, metavar="SECONDS", help="Seconds per task."),
               arch: Optional[str] = typer.Option(None, "--arch", metavar="ARCH", help=TARGET_ARCH_HELP),
               cuda_graph: bool = typer.Option(False, "--cuda-graph", help="Time CUDA-graph replays instead of eager launches."),
               cold_l2: ColdL2 = typer.Option(ColdL2.rotate, "--cold-l2", help="Keep L2 cold by rotating input sets, by a flush kernel, or not at all."),
               timer: Optional[str] = typer.Option(None, "--timer", metavar="TIMER", help="event | wall | module:factory"),
               no_write: bool = typer.Option(False, "--no-write", help="Write no artifact.")):
    """Same-session A/B of a recipe against itself with a lever changed: load-bearing or not, and does the card agree.

    Example: skill-run ablate triton_fp8_rowwise_batched_gemm_sm90 --shape 16,512,8192,1024 --set w_layout=kn --cuda-graph
    """
    with busy(f"ablating {skill_id} ({', '.join(set_)})"):
        r = api.ablate(index(), skill_id, shape, set_, recipe=recipe, backend=backend.value if backend else None,
                       rounds=rounds, seeds=seeds, timeout_s=timeout, arch=check_arch(arch), cuda_graph=cuda_graph,
                       cold_l2=cold_l2.value, timer=timer, write=not no_write, command=command_line())
    if want_json():
        emit_json(r)
    else:
        _print_tuning(out, r)
    if r["verdict"] in ("error", "incumbent_failed") or (r.get("ablation") or {}).get("agrees_with_card") is False:
        raise typer.Exit(EXIT_FAILURE)


def _print_tuning(out, r: dict) -> None:
    from rich.table import Table
    from rich.text import Text

    card = (r.get("card") or {}).get("id")
    from skillrun.io.termtext import plain, safe

    out.print(f"[bold]{safe(card)}[/] {safe(r.get('kind', ''))} {safe(r.get('shape'))}: [bold]{safe(r.get('verdict'))}[/] - {safe(r.get('reason'))}")
    rows = r.get("candidates") or []
    if rows:
        t = Table(show_edge=False)
        for c in ("id", "config change", "status", "sweep x", "re-check x", "reason"):
            t.add_column(c, overflow="fold")
        for c in rows:
            sw = (c.get("sweep") or {}).get("speedup_vs_incumbent")
            rc = (c.get("recheck") or {}).get("speedup_vs_incumbent")
            t.add_row(*[Text(plain(x)) for x in (c["id"], c.get("label", ""), c["status"], f"{sw:.3f}" if sw else "-",
                                                 f"{rc:.3f}" if rc else "-", str(c.get("reason", ""))[:120])])
        out.print(t)
    if r.get("artifact"):
        out.print(f"artifact: {safe(r['artifact'])}")
    if r.get("diff"):
        out.print("proposed card change" + (" (applied):" if (r.get("proposal") or {}).get("applied") else " (not applied; --apply writes it):"))
        out.print(r["diff"], markup=False, highlight=False)


# What this module adds to `skill-run`, in the order `skill-run --help` lists it.
COMMANDS = (
    ("tune", tune_cmd, {}),
    ("ablate", ablate_cmd, {}),
)
