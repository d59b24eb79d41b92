"""nnU-Net's post-processing applied to a label map (keeping the largest connected components)."""
