"""Patch training: patches and augmentation, the segmentation task of the shared loop."""
