"""A volumes dataset as it is given: MSD / nnU-Net v2 dataset.json, images and cases, the grid,
splits, the toy generator."""
