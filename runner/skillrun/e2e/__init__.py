"""`skill-run e2e`: rerun the user's workload with the planned ports routed in, and measure it.

    skillrun.e2e.run.run_e2e(command, plan, index, ...)   # the parent: arms, timing, record
    skillrun.profiling.routing                            # the workload side: dispatch-mode routing

The workload side lives in :mod:`skillrun.profiling` beside the start-up hook that installs it inside
the workload process (which may lack the runner's own dependencies); this package is the parent.
"""
