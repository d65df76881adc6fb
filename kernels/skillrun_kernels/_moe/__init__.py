"""Shared MoE plumbing: the routing contract every MoE family uses (which rows go to which expert,
in the oracle and in the Triton kernels) and the `skill-run e2e` wrapper of a Python-level layer.

The fp8 block-scale MoE family uses these; the a16wi4 family still carries its own copies, because
its measured H200 artifacts name the bytes of its modules (re-measure it before moving it here).
"""
