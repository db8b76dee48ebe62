"""fflow.scipy.cluster.vq.vq (jax.scipy.cluster.vq.vq) against scipy.cluster.vq.vq."""

import numpy as np
import pytest

import fflow
from fflow.scipy.cluster.vq import vq

sv = pytest.importorskip("scipy.cluster.vq")


def test_vq_matches_scipy():
    obs = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    book = obs[:3] + 0.1
    for o, b in ((obs, book), (obs[:, 0], book[:, 0])):
        codes, dist = fflow.jit(vq)(o, b)
        want_codes, want_dist = sv.vq(o, b)
        assert np.asarray(codes).tolist() == want_codes.tolist()
        np.testing.assert_allclose(dist, want_dist, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="same number of dims"):
        vq(obs, book[:, 0])
