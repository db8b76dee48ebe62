"""Misuse cases (issue 16): every error a user can cause names the user's own line
(file:line inside this file) and says how to fix it ("Fix: ...").

Each `c_*` function is one misuse, written as a new user would write it; the test
runs it and checks the message (and its notes) against the lines of that function.
"""

import inspect
import os
import pickle

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp
from fflow import lax

HERE = os.path.abspath(__file__)

x3 = np.ones(3, np.float32)
m23 = np.ones((2, 3), np.float32)


def c_matmul():
    return jnp.ones((2, 3)) @ jnp.ones((2, 3))


def c_matmul_jit():
    return fflow.jit(lambda a, b: a @ b)(m23, m23)


def c_reshape():
    return jnp.reshape(jnp.ones(6), (4, 2))


def c_reshape_jit():
    return fflow.jit(lambda a: a.reshape(4, 2))(np.ones(6, np.float32))


def c_concat():
    return jnp.concatenate([jnp.ones((2, 3)), jnp.ones((2, 4))])


def c_axis():
    return jnp.sum(jnp.ones(3), axis=2)


def c_axis_jit():
    return fflow.jit(lambda a: jnp.mean(a, axis=-3))(x3)


def c_transpose():
    return jnp.transpose(jnp.ones((2, 3)), (0, 2))


def c_index_jit():
    return fflow.jit(lambda a: a[:, 0])(x3)


def c_too_many_idx():
    return jnp.ones(3)[0, 0]


def c_has_aux_missing():
    return fflow.grad(lambda a: (jnp.sum(a), a))(x3)


def c_has_aux_not_pair():
    return fflow.grad(lambda a: jnp.sum(a), has_aux=True)(x3)


def c_custom_vjp_ct_shape():
    @fflow.custom_vjp
    def f(a):
        return jnp.sin(a)

    f.defvjp(lambda a: (jnp.sin(a), a), lambda r, g: (jnp.ones(2),))
    return fflow.grad(lambda a: jnp.sum(f(a)))(x3)


def c_custom_vjp_ct_arity():
    @fflow.custom_vjp
    def f(a):
        return jnp.sin(a)

    f.defvjp(lambda a: (jnp.sin(a), a), lambda r, g: (g, g))
    return fflow.grad(lambda a: jnp.sum(f(a)))(x3)


def c_zeros_neg():
    return jnp.zeros(-1)


def c_zeros_float():
    return jnp.zeros((2.5, 3))


def c_len0d():
    return len(jnp.ones(()))


def c_empty_max():
    return jnp.max(jnp.ones(0))


def c_grad_argnums():
    return fflow.grad(lambda a: jnp.sum(a), argnums=3)(x3)


def c_astype():
    return jnp.ones(3).astype("floaty")


def c_jit_str():
    return fflow.jit(lambda a: a)("hello")


def c_jit_none():
    return fflow.jit(lambda a: a + 1)(None)


def c_jit_3():
    return fflow.jit(3)


def c_zeros_tracer():
    return fflow.jit(lambda n: jnp.zeros(n))(3)


def c_tree_map():
    return fflow.tree_util.tree_map(lambda a, b: a + b, (1, 2), (1, 2, 3))


def c_vmap_axes():
    return fflow.vmap(lambda a, b: a + b, in_axes=(0,))(x3, x3)


def c_vmap_sizes():
    return fflow.vmap(lambda a, b: a + b)(x3, np.ones(4, np.float32))


def c_einsum():
    return jnp.einsum("ij,jk->ik", jnp.ones((2, 3)), jnp.ones((4, 5)))


def c_einsum_bad():
    return jnp.einsum("ij,j->q", jnp.ones((2, 3)), jnp.ones(3))


def c_ragged():
    return jnp.array([[1, 2], [3]])


def c_grad_array():
    return fflow.grad(jnp.ones(3))


def c_grad_nonscalar():
    return fflow.grad(jnp.sin)(x3)


def c_grad_int():
    return fflow.grad(lambda a: a * 2)(3)


def c_bool_tracer():
    return fflow.jit(lambda a: 1 if a > 0 else 0)(1.0)


def c_static_unhashable():
    return fflow.jit(lambda a, s: a, static_argnums=1)(x3, [1])


def c_static_range():
    return fflow.jit(lambda a: a, static_argnums=3)


def c_jit_kwarg():
    return fflow.jit(lambda a: a, static_argnum=0)


def c_vmap_kwarg():
    return fflow.vmap(lambda a: a, in_axis=0)


def c_grad_kwarg():
    return fflow.grad(lambda a: a, argnum=0)


def c_backend():
    return fflow.config.update("jit_backend", "cdua")


def c_jit_str_result():
    return fflow.jit(lambda a: "abc")(x3)


def c_jit_obj():
    return fflow.jit(lambda a: a)(object())


def c_pickle_tracer():
    return fflow.jit(lambda a: pickle.dumps(a) and a)(x3)


def c_lax_add_dtype():
    return lax.add(jnp.ones(3), jnp.ones(3, jnp.int32))


def c_broadcast():
    return jnp.ones(3) + jnp.ones(4)


def c_dot():
    return jnp.dot(jnp.ones(3), jnp.ones(4))


def c_leak():
    s = []
    fflow.jit(lambda a: s.append(a) or a)(x3)
    return s[0] + 1


def c_cond_branches():
    return lax.cond(True, lambda a: a, lambda a: a[:1], x3)


def c_scan_carry():
    return lax.scan(lambda c, a: (c[:1], a), x3, x3)


def c_while_carry():
    return lax.while_loop(lambda c: c[0] < 3, lambda c: c.astype(np.int32), x3)


def c_split():
    return jnp.split(jnp.ones(5), 2)


def c_stack():
    return jnp.stack([jnp.ones(2), jnp.ones(3)])


def c_take_axis():
    return jnp.take(jnp.ones(3), 0, axis=4)


def c_squeeze():
    return jnp.squeeze(jnp.ones((2, 3)), axis=0)


def c_expand():
    return jnp.expand_dims(jnp.ones(3), 5)


def c_broadcast_to():
    return jnp.broadcast_to(jnp.ones(3), (4, 2))


def c_int_tracer():
    return fflow.jit(lambda a: jnp.ones(int(a)))(3.0)


def c_setitem():
    a = jnp.ones(3)
    a[0] = 1


def c_swapaxes():
    return jnp.swapaxes(jnp.ones((2, 3)), 0, 5)


def c_moveaxis():
    return jnp.moveaxis(jnp.ones((2, 3)), 0, 7)


def c_tile():
    return jnp.reshape(jnp.ones(6), (-1, -1))


def c_where():
    return jnp.where(jnp.ones(3) > 0, jnp.ones(3), jnp.ones(4))


def c_vmap_out_axes():
    return fflow.vmap(lambda a: a, out_axes=3)(x3)


def c_inv_shape():
    return jnp.linalg.inv(jnp.ones((2, 3)))


def c_random_key():
    return fflow.random.normal(3, (2,))


def c_mean_int_axis():
    return jnp.mean(jnp.ones((2, 3)), axis=(0, 0))


CASES = {k[2:]: v for k, v in dict(globals()).items() if k.startswith("c_")}


CASES = {k[2:]: v for k, v in dict(globals()).items() if k.startswith("c_")}


@pytest.fixture(autouse=True)
def _restore_backend():
    yield
    fflow.config.update("jit_backend", "numpy")


@pytest.mark.parametrize("name", sorted(CASES))
def test_misuse_names_the_line_and_a_fix(name):
    fn = CASES[name]
    lines, first = inspect.getsourcelines(fn)
    with pytest.raises(Exception) as info:
        fn()
    err = info.value
    msg = f"{err}" + "\n".join(getattr(err, "__notes__", []))
    named = [f"{HERE}:{n}" for n in range(first, first + len(lines)) if f"{HERE}:{n}" in msg]
    assert named, f"{name}: the message does not name a line of {fn.__name__}:\n{msg}"
    assert "Fix" in msg, f"{name}: the message says no fix:\n{msg}"


def test_unknown_keyword_lists_the_valid_names():
    with pytest.raises(TypeError, match="in_axes") as info:
        fflow.vmap(lambda a: a, in_axis=0)
    assert "Did you mean 'in_axes'" in str(info.value)


def test_bad_backend_keeps_the_previous_one():
    with pytest.raises(ValueError, match="cuda_shim"):
        fflow.config.update("jit_backend", "gpu")
    assert fflow.config.jit_backend == "numpy"
    np.testing.assert_array_equal(np.asarray(fflow.jit(lambda a: a * 2)(x3)), 2 * x3)


# -- tracebacks: only the user's frames (JAX's filtering), with a switch --------------


def _frames(err):
    import traceback

    return [f.filename for f in traceback.extract_tb(err.__traceback__)]


def _model(x):
    return jnp.dot(x, jnp.ones(5))  # 3 != 5


@pytest.mark.parametrize("wrap", ["jit", "grad", "vmap", "jit_grad"])
def test_tracebacks_hide_fflow_internal_frames(wrap):
    f = {
        "jit": fflow.jit(_model),
        "grad": fflow.grad(lambda x: jnp.sum(_model(x))),
        "vmap": fflow.vmap(_model),
        "jit_grad": fflow.jit(fflow.grad(lambda x: jnp.sum(_model(x)))),
    }[wrap]
    x = np.ones(3, np.float32) if wrap != "vmap" else np.ones((2, 3), np.float32)
    with pytest.raises(fflow.errors.ShapeError) as info:
        f(x)
    frames = _frames(info.value)
    internal = [p for p in frames if fflow.errors._is_internal(p)]
    assert frames[-1] == HERE  # the deepest frame is the user's line
    assert len(internal) <= 1, internal  # at most the boundary that re-raised
    assert "traceback_filtering" in "".join(info.value.__notes__)


def test_traceback_filtering_switch_shows_internal_frames():
    fflow.config.update("traceback_filtering", "off")
    try:
        with pytest.raises(fflow.errors.ShapeError) as info:
            fflow.jit(_model)(np.ones(3, np.float32))
    finally:
        fflow.config.update("traceback_filtering", "auto")
    assert sum(fflow.errors._is_internal(p) for p in _frames(info.value)) > 3


_WARNING_SCRIPT = """
import numpy as np
import fflow, fflow.numpy as jnp
x = jnp.array([-1.0, 0.0, 1.0])
jnp.log(x); x / 0.0; jnp.sqrt(x)
fflow.jit(lambda v: jnp.exp(v * 100.0) * 1e30)(x)
fflow.grad(lambda v: jnp.sum(jnp.log(v)))(x)
print("computed")
np.log(np.array([-1.0]))  # the user's own NumPy call still warns
"""


def test_no_numpy_runtime_warnings_leak():
    # a script, as a user runs it (pytest resets warning filters around collection)
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _WARNING_SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "computed" in proc.stdout, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warned) == 1 and "<string>" in warned[0], proc.stderr
