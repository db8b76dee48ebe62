"""What several examples share: the digits data, split into train and test sets.

Imported as `import _common` (an example's own folder is on `sys.path` when it
runs as a script); not an example itself.
"""

import numpy as np


def load_digits_split(seed=0, test_fraction=0.2):
    """Digits 8x8 images scaled to [0, 1], shuffled, split into train and test sets."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])
