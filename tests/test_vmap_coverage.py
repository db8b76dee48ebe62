"""vmap of control flow and custom rules uses their batching rules, not loops. (Which
primitives have a batching rule: tests/test_op_db.py::test_rule_tables.)"""

import numpy as np

import fflow
import fflow.numpy as jnp


def test_control_flow_and_custom_rules_are_used_not_loops():
    # the batched program holds one scan / cond equation, not a Python loop per lane
    from fflow import lax

    def f(x):
        c, _ = lax.scan(lambda c, v: (c + fflow.checkpoint(jnp.sin)(v), None), 0.0, x)
        return lax.cond(c > 0, lambda a: a, lambda a: -a, c)

    text = str(fflow.make_jaxpr(fflow.vmap(f))(np.ones((4, 3), np.float32)))
    assert text.count("scan[") == 1 and "select_n" in text
    np.testing.assert_allclose(
        np.asarray(fflow.vmap(f)(np.ones((4, 3), np.float32))), [3 * np.sin(1.0)] * 4, rtol=1e-6
    )
