"""Mixture-of-experts layer with fp8 e4m3 block-scaled experts (1x128 activation, 128x128 weight scales)."""
