"""Benchmarks: each prints its figures as a ratio against a baseline measured in the same run."""
