"""Placements, SBP values, the balanced layout of shards and global-array basics."""

import os
import subprocess
import sys

import numpy as np
import pytest

import fflow
from fflow.sharding import (
    B,
    P,
    S,
    assemble,
    balanced,
    canonical,
    global_from_shards,
    local_box,
    partial_max,
    partial_min,
)


def test_sbp_values_and_names():
    assert fflow.sbp.split(1) == S(1) == fflow.sbp.split(dim=1)
    assert fflow.sbp.broadcast == B and fflow.sbp.partial_sum == P
    assert repr((S(0), B, P, partial_max, partial_min)) == "(S(0), B, P, P(max), P(min))"
    assert len({S(0), S(0), B, P, partial_max}) == 4


def test_placement_1d_and_nd():
    p = fflow.placement("cpu", [0, 1, 2, 3])
    assert p.hierarchy == (4,) and p.size == 4 and p.ndim == 1
    m = fflow.placement("cpu", [[0, 1], [2, 3]])
    assert m.hierarchy == (2, 2) and m.coords(3) == (1, 1) and m.index_of((1, 0)) == 2
    assert m != p and fflow.placement("cpu", [[0, 1], [2, 3]]) == m
    assert fflow.placement("cpu", 3).ranks == (0, 1, 2)


def test_balanced_rule_first_shards_get_one_more():
    assert balanced(10, 4) == [3, 3, 2, 2]
    assert balanced(3, 4) == [1, 1, 1, 0]
    p = fflow.placement("cpu", [0, 1, 2, 3])
    x = np.arange(10.0, dtype=np.float32)
    shards = fflow.to_global(x, p, S(0)).to_local_shards()
    assert [s.tolist() for s in shards] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


def test_canonical_form_merges_and_drops():
    assert canonical((2, 2), (S(0), S(0)))[:2] == ((4,), (S(0),))
    assert canonical((1, 4), (P, S(1)))[:2] == ((4,), (S(1),))
    assert canonical((2, 1, 2), (B, S(0), B))[:2] == ((4,), (B,))
    assert canonical((2, 2), (S(0), S(1)))[:2] == ((2, 2), (S(0), S(1)))


def test_nd_layout_by_hand():
    # (S(0), S(1)) on a 2x2 mesh: device (i, j) holds row block i, column block j
    m = fflow.placement("cpu", [[0, 1], [2, 3]])
    x = np.arange(24.0, dtype=np.float32).reshape(4, 6)
    g = fflow.to_global(x, m, (S(0), S(1)))
    shards = [np.asarray(s) for s in g.to_local_shards()]
    np.testing.assert_array_equal(shards[1], x[0:2, 3:6])
    np.testing.assert_array_equal(shards[2], x[2:4, 0:3])
    assert local_box((4, 6), (S(0), S(1)), (2, 2), (1, 1)) == ((2, 4), (3, 6))


def test_assemble_partials_by_hand():
    p = fflow.placement("cpu", [0, 1, 2])
    parts = [np.array([1.0, 5.0]), np.array([2.0, -1.0]), np.array([4.0, 0.0])]
    assert assemble(parts, (2,), (P,), p).tolist() == [7.0, 4.0]
    assert assemble(parts, (2,), (partial_max,), p).tolist() == [4.0, 5.0]
    assert assemble(parts, (2,), (partial_min,), p).tolist() == [1.0, -1.0]
    g = global_from_shards(parts, (2,), p, P)
    assert np.asarray(g.to_global(sbp=B)).tolist() == [7.0, 4.0]


def test_global_array_metadata_and_local():
    p = fflow.placement("cpu", [0, 1])
    g = fflow.numpy.ones((4, 3)).to_global(p, S(1))
    assert g.placement == p and g.sbp == (S(1),) and g.shape == (4, 3)
    assert g.to_local().shape == (4, 2) and g.to_local().placement is None
    assert "sbp=(S(1),)" in repr(g)


def test_device_count_from_environment():
    code = (
        "import fflow\n"
        "fflow.placement('cpu', [0, 1])\n"
        "try:\n"
        "    fflow.placement('cpu', [0, 1, 2])\n"
        "except ValueError as e:\n"
        "    print('too many:', '2 devices' in str(e))\n"
    )
    env = dict(os.environ, FFLOW_NUM_CPU_DEVICES="2")
    env.pop("FFLOW_RUNTIME", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "too many: True", out.stderr


def test_nd_placement_needs_one_sbp_per_axis():
    m = fflow.placement("cpu", [[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="one SBP per mesh axis"):
        fflow.to_global(np.ones(4, np.float32), m, S(0))


def test_device_count_from_config():
    from fflow.sharding import num_cpu_devices

    if os.environ.get("FFLOW_NUM_CPU_DEVICES"):
        pytest.skip("the environment variable takes precedence")
    old = fflow.config.cpu_devices
    try:
        fflow.config.update("cpu_devices", 3)
        assert num_cpu_devices() == 3
        with pytest.raises(ValueError, match="3 devices"):
            fflow.placement("cpu", [0, 1, 2, 3])
    finally:
        fflow.config.update("cpu_devices", old)


def test_docstring_examples_run():
    import doctest

    import fflow.transforms.shard as shard_mod

    from fflow import sharding

    for mod in (sharding, shard_mod):
        assert doctest.testmod(mod).failed == 0
