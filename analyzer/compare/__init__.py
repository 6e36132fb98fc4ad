"""Comparing workers: the summary as rank × feature matrices, peer groups, robust statistics,
per-feature outliers, and collectives matched across ranks."""
