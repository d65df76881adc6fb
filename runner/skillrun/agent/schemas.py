"""Pydantic argument schemas of the agent tools (LangChain and MCP both derive JSON Schema from them)."""
from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

# A shape as the CLI takes it: numbers in the problem's key order, or name=value pairs.
_SHAPE_NUMS = re.compile(r"^\s*\d+(\s*[,x×]\s*\d+)*\s*$")
_SHAPE_PAIRS = re.compile(r"^\s*[A-Za-z_]+\s*=\s*\d+(\s*,\s*[A-Za-z_]+\s*=\s*\d+)*\s*$")

SHAPE_HELP = "problem shape, e.g. '4096,2048,7168' (in the card's key order, usually M,N,K) or 'M=4096,N=2048,K=7168'"


def _check_shapes(values: list[str]) -> list[str]:
    for s in values:
        if not (_SHAPE_NUMS.match(s) or _SHAPE_PAIRS.match(s)):
            raise ValueError(f"shape {s!r} is neither comma-separated integers nor name=value pairs; {SHAPE_HELP}")
    return values


def _check_arch(value: Optional[str]) -> Optional[str]:
    # The CLI's own check (skillrun.options), so an agent gets the same accepted list as a user.
    from skillrun.errors import UsageError
    from skillrun.options import check_arch

    try:
        return check_arch(value)
    except UsageError as exc:
        raise ValueError(f"{exc.reason} ({exc.hint})") from None


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Shared by every schema that has these fields: a bad shape or arch is refused before any work.
    @field_validator("shapes", check_fields=False)
    @classmethod
    def _shapes_ok(cls, v: list[str]) -> list[str]:
        return _check_shapes(v)

    @field_validator("arch", check_fields=False)
    @classmethod
    def _arch_ok(cls, v: Optional[str]) -> Optional[str]:
        return _check_arch(v)


class ListSkillsArgs(_Args):
    gen: Optional[str] = Field(None, description="only cards for this device generation, e.g. sm_90 or gfx950")
    to_backend: Optional[Literal["triton", "flydsl"]] = Field(None, description="only cards porting to this backend")


class ShowSkillArgs(_Args):
    skill_id: str = Field(..., min_length=1, description="card id from list_skills or analyze_profile")
    section: Optional[str] = Field(None, description="show only this markdown section of the card body (a heading, or part of one)")


class ReadFactArgs(_Args):
    fact_id: str = Field(..., min_length=1, description="fact id, as listed by list_skills or cited in a card's 'facts'")


class AnalyzeProfileArgs(_Args):
    path: str = Field(..., min_length=1, description="profiler trace the user provided (torch.profiler JSON[.gz], rocprofv3, nsys, ncu, …)")
    arch: Optional[str] = Field(None, description="device arch when the trace does not say (gfx950, gfx942, sm_90)")
    top: int = Field(10, ge=1, le=50, description="how many hot kernels to rank and match")
    shapes: list[str] = Field(default_factory=list, description=f"shapes for kernels whose shape the trace lacks; {SHAPE_HELP}")
    save_full: bool = Field(False, description="also write the full analysis (every kernel and op) under validation/_analysis/ "
                                               "and return its path; the default writes nothing")


class RunSkillArgs(_Args):
    skill_id: str = Field(..., min_length=1, description="card id")
    shapes: list[str] = Field(..., min_length=1, description=SHAPE_HELP)
    backend: Optional[Literal["cuda", "rocm", "cpu"]] = Field(
        None, description="default: the GPU present; 'cpu' checks numerics of CPU-runnable ports on small shapes (no timing)")
    seeds: int = Field(3, ge=1, le=10, description="fresh random inputs per seed")
    write: bool = Field(True, description="write a validation artifact under validation/")


class CheckSkillArgs(_Args):
    skill_id: str = Field(..., min_length=1, description="id of a FlyDSL card")
    arch: Optional[str] = Field(None, description="target arch (default: the card's first gen)")
    shapes: list[str] = Field(default_factory=list, description=f"shapes to compile (default: the card's own); {SHAPE_HELP}")
    write: bool = Field(True, description="write a compile_only validation artifact under validation/")


class ReadValidationArgs(_Args):
    path: Optional[str] = Field(None, description="one artifact (.yaml), a saved analysis (.json) or a folder; omit to list the latest artifacts")
    skill_id: Optional[str] = Field(None, description="when listing: only artifacts of this card")
    limit: int = Field(10, ge=1, le=50, description="when listing: how many of the newest artifacts")
