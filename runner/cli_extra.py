"""Commands whose implementation lives outside the core pipeline (workload profiling, agent, MCP)."""
from __future__ import annotations

from skillrun.cli import app as _app
from skillrun.profile_cli import register as _register_profile

_register_profile(_app)
from skillrun.agent.cli import register as _register_agent

_register_agent(_app)
from skillrun.cli_tune import register as _register_tune

_register_tune(_app)
from skillrun.cli_e2e import register as _register_e2e

_register_e2e(_app)
