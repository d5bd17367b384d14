"""Benchmarks of the workbench against the alternatives a user would pick (not timed tests)."""
