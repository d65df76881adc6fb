"""Seeded-defect kernels and a toy problem that prove the execution harness catches each defect.

Importable as ``defects`` when ``tests/`` is on sys.path (pytest puts it there; the harness's
children inherit the parent's import path).
"""
