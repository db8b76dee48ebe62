"""Coverage of the rule tables: walks the primitive registry and checks that every
primitive has a rule in each transform's table, or stands on that table's explicit
"no rule, on purpose" list with a reason.

One parametrised test per table; each table has its own exception list. To cover a
new table, add an entry to `TABLES` (name -> (which primitives need a rule, how to
find a primitive's rule, exceptions)).
"""

import fflow.transforms.remat  # noqa: F401  (registers custom_jvp_call, checkpoint...)
import pytest
from fflow.transforms import autodiff

import fflow
from fflow.core import primitives

# -- autodiff: JVP rules -----------------------------------------------------------
NO_JVP_RULE = {
    "iota": "no operands, so it never sees a tangent (JVPTrace binds it on the parent)",
    "attention_jvp": "second derivatives of fused attention are not provided (bias= takes the "
    "composite path, which has them)",
    "attention_bwd": "second derivatives of fused attention are not provided (see attention_jvp)",
}


def _has_jvp(prim):
    return prim in autodiff.jvp_rules


def _all(prim):
    return True


# -- autodiff: transpose rules (linear primitives only) -----------------------------
NO_TRANSPOSE_RULE = {}

_LINEAR_TRAITS = ("linear", "bilinear")


def _is_linear(prim):
    """Linear in all inputs ("linear"), or in some of them ("linear_in_*", "bilinear")."""
    return any(t in _LINEAR_TRAITS or t.startswith("linear_in") for t in prim.traits)


def _has_transpose(prim):
    return prim in autodiff.transpose_rules


TABLES = {
    "jvp_rules": (_all, _has_jvp, NO_JVP_RULE),
    "transpose_rules": (_is_linear, _has_transpose, NO_TRANSPOSE_RULE),
}


def _params():
    out = []
    for table, (needs, _, _) in TABLES.items():
        for name in sorted(primitives):
            if needs(primitives[name]):
                out.append(pytest.param(table, name, id=f"{table}-{name}"))
    return out


@pytest.mark.parametrize("table,name", _params())
def test_rule_coverage(table, name):
    _, has_rule, exceptions = TABLES[table]
    prim = primitives[name]
    if name in exceptions:
        assert not has_rule(prim), (
            f"{name} has a rule in {table} but is also on its 'no rule' list: remove it there"
        )
        return
    assert has_rule(prim), (
        f"primitive {name!r} has no entry in {table}: register one next to its definition, "
        f"or add it to that table's exception list in tests/test_primitive_coverage.py with "
        f"the reason"
    )


@pytest.mark.parametrize("table", sorted(TABLES))
def test_exception_lists_name_real_primitives(table):
    _, _, exceptions = TABLES[table]
    unknown = sorted(set(exceptions) - set(primitives))
    assert not unknown, f"{table} exceptions name unknown primitives: {unknown}"
    for name, reason in exceptions.items():
        assert isinstance(reason, str) and len(reason) > 10, f"{name}: give a reason"


def test_zero_derivative_primitives_give_zero_tangents():
    """Primitives registered with defzero really produce zero (symbolic) tangents."""
    import numpy as np

    import fflow.numpy as jnp

    x = jnp.asarray(np.array([0.3, -1.7, 2.5]))
    for f in (jnp.floor, jnp.sign, jnp.round, lambda v: (v > 0).astype(v.dtype)):
        _, t = fflow.jvp(f, (x,), (jnp.ones(3, dtype=x.dtype),))
        np.testing.assert_array_equal(np.asarray(t), np.zeros(3))
