"""Aggregation of every run's metrics into tidy tables and summaries."""
