"""The `skill-run` command line: :mod:`~skillrun.cli.entry` builds it from one module per command
group (analyze, kb, run, profile, agent, tune, e2e), which share :mod:`~skillrun.cli.common`."""
from __future__ import annotations


def main() -> None:
    """The `skill-run` script (pyproject names ``skillrun.cli:main``); the entry module is imported
    only here, when the command line runs, so that importing any command module never builds the CLI."""
    from skillrun.cli.entry import main as run_cli

    run_cli()
