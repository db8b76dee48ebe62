"""Coverage tests driven by the op database (tests/op_db.py): every registered primitive
has a record or a reason; each record runs under grad (finite differences), vmap (a
loop), jit (eager), and amp (float32 on the same inputs); every primitive has its rule
in each transform's table or an exemption with a reason."""

import ml_dtypes
import numpy as np
import pytest
from fflow.transforms import autodiff
from fflow.transforms import vmap as vm
from fflow.transforms.amp import amp_rules
from fflow.transforms.amp_policy import CLASSES
from op_db import ELSEWHERE, NO_RULE, OPS, direct_call, load_all_primitives
from shard_cases import CASES as SHARD_CASES
from test_shard_signatures import check_signatures

import fflow
import fflow.numpy as jnp
from fflow.test_util import check_grads, primitive_names
from fflow.tree_util import tree_leaves

PRIMS = load_all_primitives()


def _ids(flag):
    out, seen = [], {}
    for op in OPS:
        if getattr(op, flag) is True:
            k = seen[op.name] = seen.get(op.name, -1) + 1
            out.append(pytest.param(op, id=f"{op.name}-{k}" if k else op.name))
    return out


def _bound(fn, args):
    return primitive_names(fflow.make_jaxpr(fn)(*args))


# -- the database covers the registry ---------------------------------------------------
def test_every_primitive_has_a_record_or_a_reason():
    have = {op.name for op in OPS}
    missing = sorted(set(PRIMS) - have - set(ELSEWHERE))
    assert not missing, (
        f"primitives with no op-database row: {missing}. Add an Op(...) row to tests/op_db.py "
        f"(or an ELSEWHERE entry naming the test that covers it)"
    )
    assert not (have & set(ELSEWHERE)), "a primitive is both in OPS and ELSEWHERE"
    unknown = sorted((have | set(ELSEWHERE)) - set(PRIMS))
    assert not unknown, f"op_db names unknown primitives: {unknown}"


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_record_binds_its_primitive(op):
    args = op.draw()
    assert op.name in _bound(op.fn, args), f"the {op.name} record does not bind {op.name}"


# -- rule tables -------------------------------------------------------------------------
def _is_linear(prim):
    return any(t in ("linear", "bilinear") or t.startswith("linear_in") for t in prim.traits)


TABLES = {
    "jvp": (lambda p: True, lambda p: p in autodiff.jvp_rules),
    "transpose": (_is_linear, lambda p: p in autodiff.transpose_rules),
    "batch": (lambda p: True, lambda p: vm.get_batch_rule(p) is not None),
    "amp_class": (
        lambda p: True,
        lambda p: getattr(p, "amp_class", None) in CLASSES or p in amp_rules,
    ),
}


@pytest.mark.parametrize("table", sorted(TABLES))
def test_rule_tables(table):
    needs, has = TABLES[table]
    batch_exempt = {p.name: reason for p, reason in vm.no_batch_rule.items()}
    exempt = batch_exempt if table == "batch" else NO_RULE[table]
    missing, stale = [], []
    for name, prim in sorted(PRIMS.items()):
        if not needs(prim):
            continue
        if name in exempt:
            stale += [name] if has(prim) else []
        elif not has(prim):
            missing.append(name)
    assert not missing, (
        f"primitives with no {table} rule: {missing}: register one next to the definition, "
        f"or add an exemption with the reason (tests/op_db.py NO_RULE)"
    )
    assert not stale, f"{stale} have a {table} rule and an exemption: remove the exemption"
    assert not set(exempt) - set(PRIMS), f"{table} exemptions name unknown primitives"
    assert all(isinstance(r, str) and len(r) > 10 for r in exempt.values())


def test_zero_derivative_primitives_give_zero_tangents():
    """Primitives registered with defzero really produce zero (symbolic) tangents."""
    x = jnp.asarray(np.array([0.3, -1.7, 2.5]))
    for f in (jnp.floor, jnp.sign, jnp.round, lambda v: (v > 0).astype(v.dtype)):
        _, t = fflow.jvp(f, (x,), (jnp.ones(3, dtype=x.dtype),))
        np.testing.assert_array_equal(np.asarray(t), np.zeros(3))


# -- behaviour -------------------------------------------------------------------------
@pytest.mark.usefixtures("x64_case")  # float64: tight finite differences
@pytest.mark.parametrize("op", _ids("grad"))
def test_grad(op):
    args = op.draw(np.float64)
    check_grads(op.fn, args, order=1, modes=("fwd", "rev"), atol=op.grad_tol, rtol=op.grad_tol)


@pytest.mark.parametrize("op", _ids("vmap"))
def test_vmap_matches_loop(op):
    base = op.draw()
    batched = [np.stack([a * (1.0 + 0.05 * k) if a.dtype.kind == "f" else a for k in range(3)])
               for a in base]  # fmt: skip
    for in_axes in [(0,) * len(base), (0,) + (None,) * (len(base) - 1)]:
        xs = [b if ax == 0 else a for a, b, ax in zip(base, batched, in_axes)]
        out = fflow.vmap(op.fn, in_axes=in_axes)(*xs)
        for k in range(3):
            ref = op.fn(*[x[k] if ax == 0 else x for x, ax in zip(xs, in_axes)])
            for o, r in zip(tree_leaves(out), tree_leaves(ref)):
                np.testing.assert_allclose(np.asarray(o)[k], np.asarray(r), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op", _ids("lower"))
def test_lowering_matches_eager(op):
    args = op.draw()
    with np.errstate(all="ignore"):
        eager, jitted = tree_leaves(op.fn(*args)), tree_leaves(fflow.jit(op.fn)(*args))
        scalar = [a[(0,) * a.ndim] for a in args]  # 0-d values take the scalar path
        try:
            pairs = [(eager, jitted)]
            pairs.append((tree_leaves(op.fn(*scalar)), tree_leaves(fflow.jit(op.fn)(*scalar))))
        except Exception:  # noqa: BLE001  (shape ops need their operand's rank)
            pass
    for e_list, j_list in pairs:
        assert len(e_list) == len(j_list)
        for e, j in zip(e_list, j_list):
            e, j = np.asarray(e), np.asarray(j)
            assert (e.dtype, e.shape) == (j.dtype, j.shape)
            if op.exact:
                np.testing.assert_array_equal(e, j)
            else:
                np.testing.assert_allclose(e, j, rtol=1e-5, atol=1e-5)


BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bf16", "f16"])
@pytest.mark.parametrize(
    "op", [p for p in _ids("amp") if all(a.kind in "fd" for a in p.values[0].args)]
)
def test_amp_low_precision_impl(op, dtype):
    low_in = op.draw(dtype)
    low = tree_leaves(op.fn(*low_in))
    ref = tree_leaves(op.fn(*[a.astype(np.float32) for a in low_in]))
    eps = float(ml_dtypes.finfo(dtype).eps)
    for lo, re in zip(low, ref):
        if np.asarray(re).dtype == np.float32:
            assert lo.dtype == dtype, f"{op.name} returned {lo.dtype} for {dtype} inputs"
        np.testing.assert_allclose(np.asarray(lo).astype(np.float64),
                                   np.asarray(re).astype(np.float64), rtol=8 * eps, atol=8 * eps)  # fmt: skip


def _shard_ops():  # the primitives tests/shard_cases.py has no hand-written case for
    return [pytest.param(op, id=op.name) for op in OPS
            if op.name not in SHARD_CASES and direct_call(op) is not None]  # fmt: skip


@pytest.mark.parametrize("op", _shard_ops())
@pytest.mark.parametrize("mesh", [(3,), (2, 2)])
def test_sbp_signatures_match_numpy(op, mesh):
    args, params = direct_call(op)
    check_signatures(PRIMS[op.name], args, params, mesh)
