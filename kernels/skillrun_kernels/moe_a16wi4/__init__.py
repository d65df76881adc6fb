"""Mixture-of-experts layer with bf16 activations and int4 group-quantized weights (a16wi4)."""
