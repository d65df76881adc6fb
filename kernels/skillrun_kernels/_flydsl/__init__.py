"""Shared FlyDSL plumbing for the ports: toolchain set-up, compile-only facts, ISA parsing, kernel helpers.

Nothing here imports FlyDSL at module import time: the runner must be able to read the parsers and
the toolchain check on a machine without FlyDSL, and the device image has no pydantic/jsonschema,
so these modules use the standard library only (FlyDSL is imported inside functions).
"""
