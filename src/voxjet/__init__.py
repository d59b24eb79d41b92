"""voxjet: jet tagging and 3D segmentation from raw data to a metrics report."""

__version__ = "0.1.0"
