"""Typed PRNG keys (fflow.random.key, JAX's jax.random.key): shapes, indexing, key_data /
wrap_key_data, and the same numbers as the raw key under jit, vmap and scan. The
expected key data and samples were recorded from JAX 0.10.2 (and equal the raw
PRNGKey path, which tests/test_random*.py check against JAX)."""

import numpy as np

import fflow
from fflow import random


def test_typed_keys_shapes_and_data():
    k = random.key(7)
    ks = random.split(k, (2, 3))
    assert (k.shape, ks.shape, ks[1].shape, ks[1, 2].shape) == ((), (2, 3), (3,), ())
    assert len(random.split(k, 4)) == 4 and k.ndim == 0 and ks.size == 6
    assert str(k.dtype) == "key<fry>"
    assert random.key_data(k).tolist() == [0, 7] == random.PRNGKey(7).tolist()
    k1, k2 = random.split(k)  # unpacking gives keys
    assert isinstance(k1, random.KeyArray)
    # typed and raw keys give the same numbers (the data is the same)
    np.testing.assert_array_equal(random.key_data(k2), random.split(random.PRNGKey(7))[1])
    np.testing.assert_array_equal(
        random.normal(k2, (3,)), random.normal(random.split(random.PRNGKey(7))[1], (3,))
    )
    again = random.wrap_key_data(random.key_data(ks))
    np.testing.assert_array_equal(random.key_data(again), random.key_data(ks))


def test_typed_keys_through_jit_vmap_scan():
    k = random.key(7)
    raw = random.PRNGKey(7)
    split = fflow.jit(lambda k: random.split(k))(k)
    assert isinstance(split, random.KeyArray) and split.shape == (2,)
    np.testing.assert_array_equal(random.key_data(split), random.split(raw))
    u = fflow.vmap(lambda k: random.uniform(k))(random.split(k, 3))
    np.testing.assert_array_equal(u, fflow.vmap(lambda k: random.uniform(k))(random.split(raw, 3)))
    _, ys = fflow.lax.scan(lambda c, _: (random.split(c)[0], random.uniform(c)), k, None, length=3)
    _, yr = fflow.lax.scan(
        lambda c, _: (random.split(c)[0], random.uniform(c)), raw, None, length=3
    )
    np.testing.assert_array_equal(ys, yr)
    # recorded from JAX 0.10.2: jax.random.permutation(jax.random.key(7), 5)
    assert random.permutation(k, 5).tolist() == [4, 2, 3, 0, 1]
