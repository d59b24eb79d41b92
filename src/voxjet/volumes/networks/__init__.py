"""The segmentation networks (MONAI's, nnU-Net's residual encoder) and their cut into pipeline
stages."""
