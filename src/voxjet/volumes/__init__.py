"""3D segmentation: MSD datasets, the toy CT generator, preprocessing, patches, models, metrics."""
