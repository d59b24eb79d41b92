"""A jet-mass-only reference tagger: class likelihoods from histograms of the groomed mass on
the training split, turned into class probabilities with the training class fractions."""

from __future__ import annotations

import numpy as np

MASS_BINS, MASS_UPPER = 60, 300.0
EDGES = np.linspace(0.0, MASS_UPPER, MASS_BINS + 1)


def mass_counts(mass: np.ndarray, labels: np.ndarray, n_classes: int) -> np.ndarray:
    """[n_classes, bins] histogram counts of the groomed mass (summable over chunks)."""
    table = np.zeros((n_classes, MASS_BINS))
    for c in range(n_classes):
        h, _ = np.histogram(np.clip(mass[labels == c], 0, MASS_UPPER - 1e-6), bins=EDGES)
        table[c] = h
    return table


def mass_table(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bin edges, smoothed densities times class priors) from summed counts."""
    table = counts + 0.5  # a pseudo-count keeps empty bins from giving zero likelihood
    return EDGES, table / table.sum()


def fit_mass_histograms(
    mass: np.ndarray, labels: np.ndarray, n_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """(bin edges, [n_classes, bins] smoothed densities times class priors)."""
    return mass_table(mass_counts(mass, labels, n_classes))


def mass_probabilities(mass: np.ndarray, edges: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Posterior class probabilities [N, n_classes] from the mass alone."""
    idx = np.clip(np.digitize(mass, edges) - 1, 0, table.shape[1] - 1)
    joint = table[:, idx].T
    return joint / joint.sum(1, keepdims=True)
