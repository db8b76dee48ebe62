"""Registry-driven batching check: every gradient-check case of every primitive
(tests/test_autodiff_primitives.py CASES) gives the same numbers under vmap as a
Python loop over the examples — with all arguments batched, and with only the
first one batched."""

import numpy as np
import pytest
from test_autodiff_primitives import CASES

import fflow
from fflow.tree_util import tree_leaves

BATCH = 3


def _batch(arg, k):
    a = np.asarray(arg)
    if a.dtype.kind == "f":
        return a * (1.0 + 0.05 * k) + 0.01 * k  # different values per example
    return a


def _params():
    out = []
    for name, cases in sorted(CASES.items()):
        for case_id, fn, make_args, *_ in cases:
            out.append(pytest.param(fn, make_args, id=f"{name}-{case_id}"))
    return out


@pytest.mark.parametrize("fn,make_args", _params())
def test_vmap_of_primitive_matches_loop(fn, make_args):
    args = make_args()
    for mapped in ("all", "first"):
        in_axes = tuple(0 if (mapped == "all" or i == 0) else None for i in range(len(args)))
        batched = [
            np.stack([_batch(a, k) for k in range(BATCH)]) if ax == 0 else np.asarray(a)
            for a, ax in zip(args, in_axes)
        ]
        out = fflow.vmap(fn, in_axes=in_axes)(*batched)
        for k in range(BATCH):
            ex = [b[k] if ax == 0 else b for b, ax in zip(batched, in_axes)]
            ref = fn(*ex)
            for o, r in zip(tree_leaves(out), tree_leaves(ref)):
                np.testing.assert_allclose(
                    np.asarray(o)[k], np.asarray(r), rtol=1e-6, atol=1e-9, err_msg=mapped
                )


def test_vmap_of_reductions_and_keys():
    from fflow import lax

    x = np.random.default_rng(0).standard_normal((4, 3, 5))
    for f in (
        lambda v: lax.argmax(v, 1),
        lambda v: lax.argmin(v, 0),
        lambda v: lax.reduce_or(v > 1.0, (0,)),
        lambda v: lax.reduce_and(v > -2.0, (1,)),
    ):
        out = fflow.vmap(f, in_axes=2)(x)
        ref = np.stack([np.asarray(f(x[:, :, k])) for k in range(5)])
        np.testing.assert_array_equal(np.asarray(out), ref)
    keys = fflow.random.split(fflow.random.PRNGKey(0), 4)
    out = fflow.vmap(lambda k: fflow.random.uniform(k, (3,)))(keys)
    ref = np.stack([np.asarray(fflow.random.uniform(k, (3,))) for k in keys])
    np.testing.assert_array_equal(np.asarray(out), ref)
    out = fflow.vmap(lambda k, d: fflow.random.fold_in(k, d), in_axes=(None, 0))(
        keys[0], np.arange(3, dtype=np.uint32)
    )
    ref = np.stack([np.asarray(fflow.random.fold_in(keys[0], d)) for d in range(3)])
    np.testing.assert_array_equal(np.asarray(out), ref)
