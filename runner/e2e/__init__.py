"""`skill-run e2e`: rerun the user's workload with the planned ports routed in, and measure it.

    skillrun.e2e.run.run_e2e(command, plan, index, ...)   # the parent: arms, timing, record
    skillrun.e2e.child                                    # the workload side: dispatch-mode routing

Kept import-free: the start-up hook imports ``skillrun.e2e.child`` inside the workload process,
which may lack the runner's own dependencies.
"""
