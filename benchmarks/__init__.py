"""Benchmarks run by `make bench`; each writes figures into bench.json."""
