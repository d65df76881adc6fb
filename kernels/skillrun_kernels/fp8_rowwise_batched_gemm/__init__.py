"""Batched fp8 (e4m3) GEMM with per-row activation and per-column weight scales, bf16 output."""
