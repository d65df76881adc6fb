"""skillrun_kernels: the ports and their reference kernels, one folder per operator family.

Imported as ``skillrun_kernels`` (never ``kernels``) so it cannot shadow FlyDSL's own top-level
``kernels`` package when an upstream FlyDSL checkout is on ``sys.path``.
"""
