"""Trace analysis over an ingested Profile: the hot-kernel table, coverage, trace diff, device peaks."""
