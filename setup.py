"""Package list for the fixed layout: runner/ -> skillrun, kernels/ -> skillrun_kernels.

pyproject's `packages.find` cannot prefix the names it finds, and the layout maps folders onto
other import names, so the list is computed here (everything else lives in pyproject.toml).
"""
from setuptools import find_packages, setup


def _mapped(folder: str, name: str) -> list[str]:
    return [name] + [f"{name}.{p}" for p in find_packages(folder)]


setup(packages=_mapped("runner", "skillrun") + _mapped("kernels", "skillrun_kernels") + ["skillrun_kb"])
