"""File helpers shared by every stage: atomic writes and HDF5 access."""
