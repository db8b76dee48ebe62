"""Registry coverage: every primitive has a batching rule (its own or its family's),
or stands on vmap's explicit "no rule, on purpose" list with a reason."""

import importlib

import numpy as np
from fflow.transforms import vmap as vm

import fflow
import fflow.numpy as jnp
from fflow.core import primitives

# modules that register primitives when loaded (some load lazily)
_MODULES = [
    "fflow.random",
    "fflow.transforms.remat",
    "fflow.primitives.collectives",
    "fflow.primitives.control_flow",
]


def _load_all():
    for name in _MODULES:
        importlib.import_module(name)  # fflow's own modules: a failure is a failure


def test_every_primitive_has_a_batching_rule():
    _load_all()
    missing = [
        name
        for name, prim in sorted(primitives.items())
        if vm.get_batch_rule(prim) is None and name not in vm.no_batch_rule
    ]
    assert not missing, f"primitives without a batching rule: {missing}"
    for name, reason in vm.no_batch_rule.items():
        assert isinstance(reason, str) and reason, name


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
