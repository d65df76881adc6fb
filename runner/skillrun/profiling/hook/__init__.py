"""Start-up hook that `skill-run profile` injects into the profiled interpreter.

`sitecustomize.py` here is copied into a temporary folder put first on the child's PYTHONPATH;
it is a module of this package only so that setuptools ships it with skillrun. Importing it
outside `skill-run profile` does nothing.
"""
