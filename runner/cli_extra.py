"""Commands whose implementation lives outside the core pipeline (workload profiling, agent, MCP)."""
from __future__ import annotations
