"""Benchmarks: each op against its peers, in the same process. Run ``python -m benchmarks``."""
