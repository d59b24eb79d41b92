"""Experiment planning for a segmentation dataset, in nnU-Net's order (its experiment_planning):
`fingerprint` (what the training cases are: spacings, shapes, intensities), `spacing` (the
target spacing rule), `topology` (pooling and kernels an axis), `memory` (what a network's
training step costs), `sizing` (voxjet's planner: patch, batch and pipeline stages for a
memory budget), `resenc` (nnU-Net's residual-encoder presets), `configurations` (2d,
3d_lowres, the cascade), `storage` (the case store), `experiment` (the plan assembled) and
`planning` (the planning job). The result is one typed `Plan` (`plan_file`), read and written
only there."""
