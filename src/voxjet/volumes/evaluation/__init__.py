"""Scores on the original grids (nnU-Net's metrics), the test evaluation, find-best and its
figures."""
