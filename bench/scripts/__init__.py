"""Standalone benchmark scripts, each run as ``python -m bench.scripts.<name>``."""
