"""Standalone benchmarks; figures go to benchmarks/README.md."""
