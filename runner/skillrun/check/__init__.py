"""Compile-only static checks of FlyDSL recipes (``skill-run check``).

    from skillrun.check import check_skill
    report = check_skill(SkillIndex.load(), "flydsl_fp8_blockscale_gemm", arch="gfx950")
    report.to_json(); report.table()
"""
from skillrun.check.core import CheckReport, RecipeCheck, check_recipe, check_skill, print_table, representative_shape
from skillrun.check.gates import LDS_BUDGET, GateResult, evaluate

__all__ = ["CheckReport", "RecipeCheck", "GateResult", "LDS_BUDGET", "check_recipe", "check_skill", "evaluate",
           "print_table", "representative_shape"]
