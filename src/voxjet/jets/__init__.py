"""Jet tagging: ROOT reading, the toy JetClass generator, shards, models and metrics."""
