"""Reproducible measurements of aggregator against named peers, on the same generated files, in the same run."""
