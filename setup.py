"""The package list: pyproject's `packages.find` takes one root, and ours are two (runner/, kernels/)
plus the knowledge base's data package, so the list is computed here; everything else is in
pyproject.toml. Each package sits in a folder of its own name (runner/skillrun, kernels/skillrun_kernels).
"""
from setuptools import find_packages, setup

setup(packages=find_packages("runner") + find_packages("kernels") + ["skillrun_kb"])
