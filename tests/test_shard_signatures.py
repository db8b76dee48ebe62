"""Every primitive x every SBP signature it declares: the sharded result, assembled,
equals the primitive's NumPy reference on the whole array (1-D meshes of 2-4
devices and a 2x2 mesh; hypothesis shapes, so uneven splits are common); and
gradients of sharded primitives equal unsharded gradients."""

import numpy as np
import pytest
from fflow.transforms.shard_exec import ShardedProgram
from fflow.transforms.shard_rules import broadcast_only_reason, has_signatures, signatures
from hypothesis import given, settings
from hypothesis import strategies as st
from op_db import OPS, direct_call
from shard_cases import CASES, ELSEWHERE

import fflow
from fflow import core
from fflow.core import Eqn, Program, ShapedArray, Var

MESHES = [(2,), (3,), (4,), (2, 2)]
OP_DB_DIRECT = {op.name for op in OPS if op.name not in CASES and direct_call(op)}


def _placement(h):
    return fflow.placement("cpu", np.arange(int(np.prod(h))).reshape(h).tolist())


def _aval(a):
    a = np.asarray(a)
    return ShapedArray(a.shape, a.dtype)


def _close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    assert got.dtype == want.dtype, what
    if want.dtype.kind == "f":
        scale = max(1.0, float(np.nanmax(np.abs(want))) if want.size else 1.0)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * scale, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check_signatures(prim, args, params, hierarchy):
    pl = _placement(hierarchy)
    expect = prim.impl(*args, **params)
    expect = list(expect) if prim.multiple_results else [expect]
    in_avals = [_aval(a) for a in args]
    out_avals = [_aval(e) for e in expect]
    sigs = signatures(prim, in_avals, out_avals, params, hierarchy)
    assert sigs and all(s.is_broadcast() for nd in sigs[0].ins + sigs[0].outs for s in nd)
    for sig in sigs:
        invars = [Var(a) for a in in_avals]
        outvars = [Var(a) for a in out_avals]
        prog = Program(invars, [], [Eqn(prim, invars, params, outvars)], outvars)
        sp = ShardedProgram(prog, pl, sig.ins, sig.outs, sigs=[sig])
        ins = [fflow.to_global(fflow.numpy.asarray(a), pl, s) for a, s in zip(args, sig.ins)]
        outs = sp.run_global(ins)
        for got, want, s in zip(outs, expect, sig.outs):
            assert got.sbp == s
            _close(np.asarray(got), want, f"{prim.name} {sig.ins}->{sig.outs} on {hierarchy}")
    return sigs


def test_every_primitive_has_signatures_or_is_listed():
    import fflow.transforms.shard  # noqa: F401

    import fflow.debug  # noqa: F401  (modules that define primitives on import)

    missing = [
        name
        for name, prim in core.primitives.items()
        if not has_signatures(prim) and name not in ELSEWHERE
    ]
    assert not missing, f"primitives without SBP signatures: {missing}"
    untested = [
        name
        for name, prim in core.primitives.items()
        if name not in CASES
        and name not in ELSEWHERE
        and broadcast_only_reason(prim) is None
        and name not in OP_DB_DIRECT  # tests/test_op_db.py checks these from their rows
    ]
    assert not untested, f"primitives without a signature test case: {untested}"


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=2, deadline=None)
@given(data=st.data(), mesh=st.sampled_from(MESHES))
def test_signatures_match_numpy(name, data, mesh):
    prim = core.primitives.get(name)
    if prim is None:
        pytest.skip(f"{name} is not defined in this build")
    args, params = CASES[name](data.draw)
    check_signatures(prim, args, params, mesh)


def _differentiable():
    from fflow.transforms.autodiff import jvp_rules

    out = []
    for name in sorted(CASES):
        prim = core.primitives.get(name)
        if (
            prim is not None
            and prim in jvp_rules
            and "zero_derivative" not in prim.traits
            and not prim.multiple_results
        ):
            out.append(name)
    return out


DIFFERENTIABLE = _differentiable()


@pytest.mark.parametrize("name", DIFFERENTIABLE)
@settings(max_examples=1, deadline=None)
@given(data=st.data(), mesh=st.sampled_from(MESHES))
def test_gradients_of_every_signature(name, data, mesh):
    prim = core.primitives[name]
    args, params = CASES[name](data.draw)
    pl = _placement(mesh)
    expect = prim.impl(*args, **params)
    in_avals = [_aval(a) for a in args]
    sigs = signatures(prim, in_avals, [_aval(expect)], params, mesh)
    sig = sigs[data.draw(st.integers(0, len(sigs) - 1))]
    diff = [i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f" and a.ndim > 0]
    ct = np.random.default_rng(0).normal(size=np.shape(expect)).astype(np.float32)

    def loss(*xs):
        full = list(args)
        for i, x in zip(diff, xs):
            full[i] = x
        out = prim.bind(*full, **params)
        return fflow.numpy.sum(out * ct)

    sharded = fflow.shard(loss, pl, in_sbp=tuple(sig.ins[i] for i in diff))
    got = fflow.grad(sharded, argnums=tuple(range(len(diff))))(*[args[i] for i in diff])
    want = fflow.grad(loss, argnums=tuple(range(len(diff))))(*[args[i] for i in diff])
    for g, w in zip(got, want):
        _close(np.asarray(g), np.asarray(w), f"grad {name} {sig.ins} on {mesh}")


def test_import_fflow_installs_the_global_dispatch():
    # fflow/__init__ installs the hook; it hands eager ops on global arrays to shard's
    from fflow import array

    hooks = [h for h in array.special_dispatch if h.__module__ == "fflow"]
    assert [h.__name__ for h in hooks] == ["_global_dispatch"]
    x = fflow.to_global(
        np.arange(4.0, dtype=np.float32), fflow.placement("cpu", [0, 1]), fflow.sbp.S(0)
    )
    out = hooks[0](fflow.core.primitives["neg"], (x,), {})
    assert out.sbp == (fflow.sbp.S(0),) and np.asarray(out).tolist() == [-0.0, -1.0, -2.0, -3.0]
