"""Segmentation of volumes, in nnU-Net's stage folders: dataset/ (dataset.json, images, cases,
splits) → plan/ (fingerprint, experiment plan) → preprocessing/ (case files) → training/ →
inference/ (sliding window, predict, export) → evaluation/ (metrics, find-best) and
postprocessing/; networks/ are the models every stage builds from the plan."""
