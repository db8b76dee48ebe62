"""What several examples share: the digits data, split into train and test sets.

Imported as `import _common` (an example's own folder is on `sys.path` when it
runs as a script); not an example itself.
"""

import gzip
import importlib.util
import os

import numpy as np


def _digits():
    """scikit-learn's bundled digits table (data, target), read without importing
    sklearn: the import (and scipy's) takes seconds of wall time, most of it waiting,
    and far longer on a busy machine."""
    spec = importlib.util.find_spec("sklearn")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    if not os.path.exists(path):  # another layout: sklearn's own loader
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.data, digits.target
    with gzip.open(path) as f:
        table = np.loadtxt(f, delimiter=",")  # as sklearn.datasets.load_digits reads it
    return table[:, :-1], table[:, -1].astype(int)


def load_digits_split(seed=0, test_fraction=0.2):
    """Digits 8x8 images scaled to [0, 1], shuffled, split into train and test sets."""
    data, target = _digits()
    x = (data / 16.0).astype(np.float32)
    y = target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])
