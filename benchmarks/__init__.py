"""Reproducible benchmarks: our server against named peers on the same generated files (`python -m benchmarks.run`)."""
