"""A jet-mass-only reference tagger: class likelihoods from histograms of the groomed mass on
the training split, turned into class probabilities with the training class fractions."""

from __future__ import annotations

import numpy as np


def fit_mass_histograms(
    mass: np.ndarray, labels: np.ndarray, n_classes: int, bins: int = 60, upper: float = 300.0
) -> tuple[np.ndarray, np.ndarray]:
    """(bin edges, [n_classes, bins] smoothed densities times class priors)."""
    edges = np.linspace(0.0, upper, bins + 1)
    table = np.zeros((n_classes, bins))
    for c in range(n_classes):
        h, _ = np.histogram(np.clip(mass[labels == c], 0, upper - 1e-6), bins=edges)
        table[c] = h + 0.5  # a pseudo-count keeps empty bins from giving zero likelihood
    return edges, table / table.sum()


def mass_probabilities(mass: np.ndarray, edges: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Posterior class probabilities [N, n_classes] from the mass alone."""
    idx = np.clip(np.digitize(mass, edges) - 1, 0, table.shape[1] - 1)
    joint = table[:, idx].T
    return joint / joint.sum(1, keepdims=True)
