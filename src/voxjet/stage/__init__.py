"""Staging: copy datasets from where they live to fast storage, verified by checksum."""
