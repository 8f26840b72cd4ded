"""Reproducible performance runs of agentq (issue 4): `python -m benchmarks run [--quick]`.

See docs/benchmarks.md for what is measured and how to run it.
"""
