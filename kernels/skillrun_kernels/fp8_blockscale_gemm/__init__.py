"""fp8 block-scale GEMM (1x128 activation scales, 128x128 weight scales, bf16 out).

``problem`` holds the shared problem definition (inputs, oracle, flops, bytes); ``references``
the oracle-as-kernel and vendor baselines; ``triton_sm90`` the Triton port for Hopper.
"""
