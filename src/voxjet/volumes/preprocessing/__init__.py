"""nnU-Net's preprocessing: each case resampled and normalised with the plan into the case store."""
