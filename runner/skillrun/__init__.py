"""skillrun: expert-skill knowledge base and agent runner for GPU kernel porting.

The pipeline stages are plain typed functions in :mod:`skillrun.api`; the CLI, the Python API
and the agent tools all call those same functions.
"""
__version__ = "0.1.0"
