"""Benchmarks: ``python -m benchmarks`` (or ``make bench``) prints figures and ratios.

Ratios measured in one run are the headline; absolute times on a shared machine are not.
"""
