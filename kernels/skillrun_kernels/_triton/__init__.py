"""Shared Triton plumbing for the sm_90 ports (compile-only facts on a machine without a GPU)."""
