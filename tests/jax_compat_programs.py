"""Small programs written against JAX's public API (see tests/jax_compat_util.py).

Every program takes the modules `(jax, jnp, lax)` and returns its outputs; the same
source runs under JAX (to record golden values) and under fflow.
"""

# ruff: noqa: E731, B023, UP031

import dataclasses
import functools
from typing import NamedTuple

import numpy as np

PROGRAMS = {}


def program(fn):
    PROGRAMS[fn.__name__] = fn
    return fn


# --- models, losses, optimizers ------------------------------------------------------


@program
def mlp_sgd(jax, jnp, lax):
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    params = {
        "w1": jax.random.normal(k1, (4, 8)) * 0.5,
        "b1": jnp.zeros(8),
        "w2": jax.random.normal(k2, (8, 1)) * 0.5,
        "b2": jnp.zeros(1),
    }
    x = jax.random.normal(k3, (16, 4))
    y = jnp.sin(x.sum(axis=1, keepdims=True))

    def predict(p, x):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return h @ p["w2"] + p["b2"]

    def loss(p, x, y):
        return jnp.mean((predict(p, x) - y) ** 2)

    @jax.jit
    def step(p, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g), l

    losses = []
    for _ in range(5):
        params, l = step(params, x, y)
        losses.append(l)
    return params, jnp.stack(losses)


@program
def logistic_regression(jax, jnp, lax):
    x = jnp.array([[0.5, 1.0], [-1.0, 2.0], [1.5, -0.5], [0.0, 0.3]])
    y = jnp.array([1, 0, 1, 0])

    def loss(w, b):
        logits = x @ w + b
        return -jnp.mean(y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits))

    w, b = jnp.zeros(2), 0.0
    g = jax.grad(loss, argnums=(0, 1))
    for _ in range(3):
        gw, gb = g(w, b)
        w, b = w - 0.5 * gw, b - 0.5 * gb
    return w, b, loss(w, b)


@program
def softmax_xent(jax, jnp, lax):
    logits = jnp.array([[2.0, 1.0, 0.1], [0.5, 2.5, -1.0]])
    labels = jnp.array([0, 1])
    onehot = jax.nn.one_hot(labels, 3)
    lsm = jax.nn.log_softmax(logits, axis=-1)
    loss = -jnp.sum(onehot * lsm, axis=-1).mean()
    g = jax.grad(lambda l: -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(l), -1)))(logits)
    return loss, g, jax.nn.softmax(logits), jax.nn.logsumexp(logits, axis=1)


@program
def adam_tree_map(jax, jnp, lax):
    params = {"a": jnp.array([1.0, -2.0]), "b": (jnp.array(3.0), jnp.ones((2, 2)))}
    f = lambda p: jnp.sum(p["a"] ** 2) + p["b"][0] ** 2 + jnp.sum(jnp.tanh(p["b"][1]))
    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    for t in range(1, 4):
        g = jax.grad(f)(params)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g**2, v, g)
        mh = jax.tree_util.tree_map(lambda m: m / (1 - 0.9**t), m)
        vh = jax.tree_util.tree_map(lambda v: v / (1 - 0.999**t), v)
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - 0.1 * m / (jnp.sqrt(v) + 1e-8), params, mh, vh
        )
    return params, f(params)


@program
def linear_regression_closed_form(jax, jnp, lax):
    x = jnp.linspace(0.0, 1.0, 10)
    X = jnp.stack([jnp.ones_like(x), x, x**2], axis=1)
    y = 1.0 + 2.0 * x - 0.5 * x**2
    w = jnp.linalg.solve(X.T @ X, X.T @ y)
    return w, jnp.linalg.norm(X @ w - y) < 1e-3


@program
def huber_and_l2(jax, jnp, lax):
    r = jnp.array([-3.0, -0.5, 0.0, 0.2, 2.0])
    huber = jnp.where(jnp.abs(r) < 1.0, 0.5 * r**2, jnp.abs(r) - 0.5)
    gh = jax.grad(lambda r: jnp.sum(jnp.where(jnp.abs(r) < 1.0, 0.5 * r**2, jnp.abs(r) - 0.5)))(r)
    return huber, gh, jnp.linalg.norm(r), jnp.linalg.norm(r, ord=1), jnp.linalg.norm(r, ord=jnp.inf)


# --- grad variants ---------------------------------------------------------------------


@program
def grad_has_aux(jax, jnp, lax):
    def f(x, y):
        out = jnp.sum(x**2 * y)
        return out, {"out": out, "mean": jnp.mean(x)}

    (v, aux), g = jax.value_and_grad(f, has_aux=True)(jnp.arange(3.0), 2.0)
    g2, aux2 = jax.grad(f, argnums=1, has_aux=True)(jnp.arange(3.0), 2.0)
    return v, aux, g, g2, aux2


@program
def grad_argnums_tuple(jax, jnp, lax):
    f = lambda a, b, c: jnp.sum(a * b) + c**3
    ga, gc = jax.grad(f, argnums=(0, 2))(jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]), 2.0)
    gb = jax.grad(f, 1)(jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]), 2.0)
    return ga, gc, gb


@program
def grad_of_python_scalar(jax, jnp, lax):
    g = jax.grad(lambda x: x**3 + 2 * x)(2.0)
    gg = jax.grad(jax.grad(lambda x: jnp.sin(x) * x))(1.0)
    return g, gg


@program
def grad_through_control(jax, jnp, lax):
    def f(x):
        return jnp.where(x > 0, x**2, -x) + jnp.maximum(x, 0.5) + jnp.clip(x, -1.0, 1.0)

    return jax.vmap(jax.grad(f))(jnp.array([-2.0, 0.2, 0.7, 3.0]))


@program
def jacobians_hessian(jax, jnp, lax):
    f = lambda x: jnp.array([x[0] * x[1], jnp.sin(x[0]) + x[1] ** 2, jnp.exp(x[1])])
    x = jnp.array([0.5, 1.5])
    g = lambda x: jnp.sum(x**3) + x[0] * x[1]
    return jax.jacfwd(f)(x), jax.jacrev(f)(x), jax.hessian(g)(x)


@program
def jacrev_dict_input(jax, jnp, lax):
    f = lambda p: p["w"] * p["b"]
    j = jax.jacrev(f)({"w": jnp.array([1.0, 2.0]), "b": jnp.array(3.0)})
    return j


@program
def jvp_vjp_linearize(jax, jnp, lax):
    f = lambda x, y: (jnp.sin(x) * y, jnp.sum(x * y))
    x, y = jnp.array([0.1, 0.2]), jnp.array([1.0, 2.0])
    primals, tangents = jax.jvp(f, (x, y), (jnp.ones(2), jnp.zeros(2)))
    out, vjp_fn = jax.vjp(f, x, y)
    ct = vjp_fn((jnp.ones(2), 1.0))
    y0, f_lin = jax.linearize(lambda x: jnp.cos(x) ** 2, x)
    return primals, tangents, out, ct, y0, f_lin(jnp.array([1.0, -1.0]))


@program
def stop_gradient_prog(jax, jnp, lax):
    f = lambda x: jnp.sum(x * lax.stop_gradient(x) + jax.lax.stop_gradient(x**2))
    return jax.grad(f)(jnp.array([1.0, 2.0, 3.0]))


# --- jit ----------------------------------------------------------------------------


@program
def jit_static_argnums(jax, jnp, lax):
    @functools.partial(jax.jit, static_argnums=(1,))
    def f(x, n):
        for _ in range(n):
            x = x * 2 + 1
        return x

    @functools.partial(jax.jit, static_argnames=("mode",))
    def g(x, mode="sum"):
        return x.sum() if mode == "sum" else x.max()

    return f(jnp.arange(3.0), 3), g(jnp.arange(4.0)), g(jnp.arange(4.0), mode="max")


@program
def jit_kwargs_and_pytrees(jax, jnp, lax):
    @jax.jit
    def f(params, x, scale=1.0):
        return {"y": params["w"] @ x * scale, "n": jnp.linalg.norm(x)}

    out = f({"w": jnp.eye(2) * 3}, jnp.array([1.0, 2.0]), scale=0.5)
    return out, f({"w": jnp.eye(2)}, x=jnp.array([3.0, 4.0]))


@program
def jit_python_scalars_weak(jax, jnp, lax):
    f = jax.jit(lambda x, y: x * y + 1)
    return f(2.0, 3.0), f(jnp.float32(2), 3), f(2, 3), f(jnp.array([1, 2], dtype=jnp.int8), 3)


@program
def jit_closure_and_retrace(jax, jnp, lax):
    c = jnp.array([1.0, 2.0])

    @jax.jit
    def f(x):
        return x + c

    a = f(jnp.zeros(2))
    b = f(jnp.zeros((3, 2)))
    return a, b, jax.jit(jnp.dot)(c, c)


# --- vmap ----------------------------------------------------------------------------


@program
def vmap_in_out_axes(jax, jnp, lax):
    x = jnp.arange(6.0).reshape(2, 3)
    y = jnp.arange(3.0)
    a = jax.vmap(lambda a, b: a * b, in_axes=(1, 0))(x, y)
    b = jax.vmap(lambda a, b: a + b, in_axes=(0, None))(x, y)
    c = jax.vmap(lambda a: a * 2, out_axes=1)(x)
    d = jax.vmap(jnp.dot, in_axes=(0, None))(x, y)
    return a, b, c, d


@program
def vmap_nested_pytree(jax, jnp, lax):
    def f(p, x):
        return {"s": jnp.sum(p["w"] * x), "t": (p["b"] + x.mean(),)}

    p = {"w": jnp.ones((4, 3)), "b": jnp.arange(4.0)}
    x = jnp.arange(12.0).reshape(4, 3)
    out = jax.vmap(f)(p, x)
    outer = jax.vmap(jax.vmap(lambda a, b: a * b, (0, None)), (None, 0))(
        jnp.arange(3.0), jnp.arange(2.0)
    )
    dict_axes = jax.vmap(f, in_axes=({"w": 0, "b": None}, 0))({"w": jnp.ones((4, 3)), "b": 1.0}, x)
    return out, outer, dict_axes


@program
def per_example_grads(jax, jnp, lax):
    w = jnp.array([0.5, -0.3])
    xs = jnp.array([[1.0, 2.0], [3.0, -1.0], [0.0, 1.0]])
    ys = jnp.array([1.0, 0.0, 2.0])
    loss = lambda w, x, y: (jnp.dot(w, x) - y) ** 2
    return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(w, xs, ys)


@program
def vmap_batched_matmul_einsum(jax, jnp, lax):
    a = jnp.arange(24.0).reshape(2, 3, 4)
    b = jnp.arange(40.0).reshape(2, 4, 5) / 10
    return (
        jax.vmap(jnp.matmul)(a, b),
        jnp.einsum("bij,bjk->bik", a, b),
        jnp.einsum("bij->bj", a),
        jnp.einsum("ij,ij->", a[0], a[1]),
        jnp.einsum("i,j->ij", jnp.arange(2.0), jnp.arange(3.0)),
    )


# --- custom rules --------------------------------------------------------------------


@program
def custom_jvp_prog(jax, jnp, lax):
    @jax.custom_jvp
    def log1pexp(x):
        return jnp.log(1.0 + jnp.exp(x))

    @log1pexp.defjvp
    def _jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return log1pexp(x), t * jax.nn.sigmoid(x)

    xs = jnp.array([-3.0, 0.0, 5.0])
    return log1pexp(xs), jax.vmap(jax.grad(log1pexp))(xs), jax.jit(jax.grad(log1pexp))(10.0)


@program
def custom_vjp_prog(jax, jnp, lax):
    @jax.custom_vjp
    def clip_grad(x, lo):
        return x

    def fwd(x, lo):
        return x, lo

    def bwd(lo, g):
        return (jnp.clip(g, -lo, lo), None)

    clip_grad.defvjp(fwd, bwd)
    f = lambda x: jnp.sum(clip_grad(x, 0.5) * jnp.array([3.0, 0.1, -2.0]))
    return jax.grad(f)(jnp.ones(3))


@program
def custom_vjp_nondiff(jax, jnp, lax):
    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def scale(s, x):
        return s * x

    scale.defvjp(lambda s, x: (s * x, None), lambda s, res, g: (s * g * 10,))
    return jax.grad(lambda x: jnp.sum(scale(2.0, x)))(jnp.arange(3.0))


# --- control flow -------------------------------------------------------------------


@program
def scan_cumsum_rnn(jax, jnp, lax):
    def step(c, x):
        c = c + x
        return c, c * 2

    final, ys = lax.scan(step, 0.0, jnp.arange(5.0))
    W = jnp.array([[0.5, -0.2], [0.1, 0.3]])

    def rnn(h, x):
        h = jnp.tanh(W @ h + x)
        return h, h.sum()

    hT, hs = jax.lax.scan(rnn, jnp.zeros(2), jnp.ones((4, 2)))
    g = jax.grad(
        lambda W0: jax.lax.scan(
            lambda h, x: (jnp.tanh(W0 @ h + x), None), jnp.zeros(2), jnp.ones((3, 2))
        )[0].sum()
    )(W)
    return final, ys, hT, hs, g


@program
def scan_no_xs_length_reverse(jax, jnp, lax):
    c, ys = lax.scan(lambda c, _: (c * 2, c), 1.0, None, length=4)
    c2, ys2 = lax.scan(lambda c, x: (c + x, c), 0, jnp.arange(4), reverse=True)
    c3, ys3 = lax.scan(
        lambda c, x: ((c[0] + x["a"], c[1] * 2), x["b"] * c[0]),
        (0.0, 1.0),
        {"a": jnp.ones(3), "b": jnp.arange(3.0)},
    )
    return c, ys, c2, ys2, c3, ys3


@program
def fori_while_loops(jax, jnp, lax):
    s = lax.fori_loop(0, 10, lambda i, acc: acc + i, 0)
    f = lax.fori_loop(0, 5, lambda i, x: x * 1.5 + i, jnp.ones(2))

    def cond(state):
        i, x = state
        return (i < 100) & (x < 1000.0)

    i, x = lax.while_loop(cond, lambda s: (s[0] + 1, s[1] * 3.0), (0, 1.0))
    newton = lax.while_loop(
        lambda x: jnp.abs(x * x - 2.0) > 1e-6, lambda x: x - (x * x - 2.0) / (2 * x), 1.0
    )
    return s, f, i, x, newton


@program
def cond_switch(jax, jnp, lax):
    f = lambda x: lax.cond(x.sum() > 0, lambda v: v * 2, lambda v: -v, x)
    a = f(jnp.array([1.0, 2.0])), f(jnp.array([-1.0, -2.0]))
    br = [lambda x: x + 1, lambda x: x * 10, lambda x: x - 100]
    b = [lax.switch(i, br, 5.0) for i in (0, 1, 2, 7, -1)]
    g = jax.grad(lambda x: lax.cond(x > 1.0, jnp.sin, jnp.cos, x))(2.0)
    v = jax.vmap(lambda p, x: lax.cond(p, lambda x: x * 2, lambda x: x + 1, x))(
        jnp.array([True, False]), jnp.array([3.0, 3.0])
    )
    return a, b, g, v


@program
def jit_fori_with_grad(jax, jnp, lax):
    @jax.jit
    def f(x):
        return lax.fori_loop(0, 3, lambda i, v: jnp.sin(v) + i, x)

    return f(0.5), jax.grad(f)(0.5)


# --- random -----------------------------------------------------------------------------


@program
def random_functions(jax, jnp, lax):
    key = jax.random.PRNGKey(42)
    k1, k2, k3, k4, k5, k6 = jax.random.split(key, 6)
    return (
        jax.random.uniform(k1, (3,), minval=-1.0, maxval=2.0),
        jax.random.normal(k2, (2, 2)),
        jax.random.randint(k3, (5,), 0, 10),
        jax.random.bernoulli(k4, 0.3, (6,)),
        jax.random.permutation(k5, 6),
        jax.random.choice(k6, 10, (3,), replace=False),
        jax.random.categorical(k1, jnp.array([0.1, 2.0, -1.0]), shape=(4,)),
        jax.random.fold_in(key, 7),
        jax.random.truncated_normal(k2, -1.0, 1.0, (3,)),
    )


@program
def random_key_api(jax, jnp, lax):
    k = jax.random.key(3)
    ks = jax.random.split(k)
    n = jax.random.normal(ks[0], (3,))
    data = jax.random.key_data(ks)
    return (
        n,
        data,
        jax.random.uniform(jax.random.fold_in(k, 1)),
        jax.vmap(lambda k: jax.random.normal(k))(jax.random.split(jax.random.PRNGKey(0), 3)),
    )


@program
def random_dropout(jax, jnp, lax):
    key = jax.random.PRNGKey(1)
    x = jnp.ones((4, 5))
    keep = jax.random.bernoulli(key, 0.8, x.shape)
    return (
        jnp.where(keep, x / 0.8, 0.0),
        jax.random.normal(key, (2,), dtype=jnp.float16),
        jax.random.exponential(key, (2,)),
    )


# --- indexing and .at updates ---------------------------------------------------------


@program
def indexing_basic(jax, jnp, lax):
    x = jnp.arange(24).reshape(2, 3, 4)
    return (
        x[1],
        x[:, 1],
        x[..., -1],
        x[0, ::2, 1:3],
        x[None, 1, :, None].shape,
        x[jnp.array([1, 0])],
        x[:, jnp.array([0, 2]), jnp.array([1, 3])],
        x[x > 20],
        x[1, -1, -1],
        x[(0, 1)],
        x[[0, 1], [2, 0]],
    )


@program
def at_updates(jax, jnp, lax):
    x = jnp.zeros(5)
    return (
        x.at[2].set(7.0),
        x.at[1:3].add(1.0),
        x.at[jnp.array([0, 0, 4])].add(1.0),
        jnp.arange(5.0).at[jnp.array([1, 3])].multiply(10.0),
        jnp.arange(5.0).at[2].get(),
        jnp.arange(5.0).at[::2].min(1.0),
        jnp.arange(5.0).at[-1].max(10.0),
        jnp.ones((2, 3)).at[:, 1].set(jnp.array([5.0, 6.0])),
        jnp.arange(5).at[2].set(9.7),
        jnp.arange(5.0).at[jnp.array([1, 7])].get(mode="fill", fill_value=-1.0),
        jnp.arange(6.0).reshape(2, 3).at[1].divide(2.0),
    )


@program
def at_update_grad(jax, jnp, lax):
    f = lambda x: jnp.sum(jnp.zeros(4).at[jnp.array([0, 2, 2])].add(x**2))
    g = lambda x: jnp.sum(x.at[1].set(0.0) * 3)
    return jax.grad(f)(jnp.array([1.0, 2.0, 3.0])), jax.grad(g)(jnp.ones(3))


@program
def take_gather(jax, jnp, lax):
    x = jnp.arange(12.0).reshape(3, 4)
    return (
        jnp.take(x, jnp.array([2, 0]), axis=1),
        jnp.take_along_axis(x, jnp.array([[0], [3], [1]]), axis=1),
        x[jnp.arange(3), jnp.array([1, 2, 3])],
        jnp.take(x, 5),
        jnp.nonzero(jnp.array([0, 3, 0, 1]))[0],
        jnp.argwhere(jnp.eye(2)),
    )


# --- dtypes -----------------------------------------------------------------------------


@program
def dtype_promotion(jax, jnp, lax):
    i32 = jnp.arange(3)
    f32 = jnp.ones(3)
    i8 = jnp.array([1, 2, 3], dtype=jnp.int8)
    u8 = jnp.array([1, 2, 3], dtype=jnp.uint8)
    b = jnp.array([True, False, True])
    f16 = jnp.ones(3, dtype=jnp.float16)
    bf = jnp.ones(3, dtype=jnp.bfloat16)
    return (
        i32 + 1.5,
        i32 * 2,
        i8 + 1,
        i8 + i32,
        u8 + i8,
        f16 + 1.0,
        f16 + f32,
        bf + f16,
        b + b,
        b * 2.5,
        i32 / 2,
        i32 // 2,
        i8 / i8,
        jnp.float32(1) + 2,
        jnp.array(1.5) * 2,
        i32**2,
        2**i32,
        f16 * i32,
        jnp.uint32(5) - 1,
    )


@program
def dtype_numpy_inputs(jax, jnp, lax):
    a = np.array([1.5, 2.5], dtype=np.float64)
    b = np.array([1, 2], dtype=np.int64)
    return (
        jnp.asarray(a),
        jnp.array(b),
        jnp.ones(2) + a,
        jnp.arange(2) + b,
        jnp.float32(2) * np.float64(3.0),
        jnp.sum(a),
        jax.grad(lambda x: jnp.sum(x**2))(a),
        jnp.array([1, 2.0]),
        jnp.array([True, 2]),
        jnp.array(3),
        jnp.array(3.0).dtype == jnp.float32,
        jnp.zeros((2,), dtype=float),
        jnp.zeros((2,), dtype=int),
        jnp.asarray(np.float32(1.0)) + np.arange(2),
    )


@program
def dtype_astype_and_result_type(jax, jnp, lax):
    x = jnp.array([1.7, -2.3, 3.5])
    return (
        x.astype(jnp.int32),
        x.astype("float16"),
        x.astype(bool),
        jnp.result_type(jnp.int8, jnp.float16) == jnp.float16,
        str(jnp.promote_types(jnp.int32, jnp.float32)),
        str(jnp.result_type(1, jnp.int8)),
        jnp.issubdtype(x.dtype, jnp.floating),
        jnp.issubdtype(jnp.int32, jnp.integer),
        str(jnp.finfo(jnp.float32).eps),
        int(jnp.iinfo(jnp.int8).max),
        jnp.round(x),
        jnp.floor(x).astype(int),
        x.astype(jnp.uint8),
    )


@program
def weak_types(jax, jnp, lax):
    a = jnp.array(2.0)
    b = jnp.asarray(2.0)
    c = jnp.float32(2.0)
    d = jnp.ones(()) * 2
    e = jnp.full((2,), 3.0)
    f = jnp.zeros(2) + 1
    g = jax.jit(lambda x: x * 2)(3.0)
    h = jnp.sum(jnp.arange(3))
    return a, b, c, d, e, f, g, h, jnp.array(2.0) + jnp.array(1, dtype=jnp.int8)


# --- reductions --------------------------------------------------------------------------


@program
def reductions(jax, jnp, lax):
    x = jnp.arange(12.0).reshape(3, 4) - 5
    m = x > 0
    return (
        x.sum(),
        x.sum(axis=0),
        x.sum(axis=(0, 1)),
        x.mean(axis=1, keepdims=True),
        jnp.max(x, axis=-1),
        jnp.min(x, axis=0, keepdims=True),
        jnp.sum(x, where=m),
        jnp.mean(x, axis=1, where=m),
        jnp.max(x, where=~m, initial=-100.0),
        jnp.var(x, axis=0),
        jnp.std(x, ddof=1),
        jnp.prod(x[:, :2] + 6, axis=0),
        jnp.argmax(x, axis=1),
        jnp.argmin(x),
        jnp.any(m, axis=1),
        jnp.all(m),
        jnp.count_nonzero(m, axis=0),
        jnp.sum(jnp.arange(5, dtype=jnp.int8)),
        jnp.sum(jnp.array([True, True, False])),
        jnp.mean(jnp.arange(4)),
        jnp.median(x, axis=0),
        jnp.percentile(x, 25.0),
        jnp.nanmean(jnp.array([1.0, jnp.nan, 3.0])),
        jnp.nansum(jnp.array([1.0, jnp.nan, 3.0])),
        jnp.ptp(x, axis=1),
        jnp.average(x, axis=1, weights=jnp.array([1.0, 2.0, 3.0, 4.0])),
    )


@program
def cumulative_and_sorting(jax, jnp, lax):
    x = jnp.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0])
    m = jnp.array([[3, 1], [2, 5]])
    return (
        jnp.cumsum(x),
        jnp.cumprod(x[:4]),
        jnp.cumsum(m, axis=0),
        jnp.cumsum(m),
        jnp.sort(x),
        jnp.argsort(x),
        jnp.sort(m, axis=0),
        jnp.sort(x)[::-1],
        jnp.argsort(-x),
        lax.top_k(x, 3),
        jnp.unique(jnp.array([3, 1, 3, 2])),
        jnp.searchsorted(jnp.array([1.0, 2.0, 3.0]), jnp.array([0.5, 2.0, 2.5])),
        jnp.cumsum(jnp.array([True, True, False])),
        jnp.diff(x),
        lax.cummax(x),
        jnp.lexsort((jnp.array([1, 0, 1]), jnp.array([2, 2, 1]))),
    )


# --- shapes and creation -------------------------------------------------------------


@program
def shape_ops(jax, jnp, lax):
    x = jnp.arange(12.0)
    m = x.reshape(3, 4)
    return (
        x.reshape(-1, 2).shape,
        m.T,
        m.reshape(-1),
        m.reshape((2, 6)),
        jnp.transpose(m.reshape(3, 2, 2), (2, 0, 1)).shape,
        jnp.concatenate([m, m], axis=1).shape,
        jnp.stack([x, x], axis=-1).shape,
        jnp.expand_dims(x, (0, 2)).shape,
        jnp.squeeze(m[None, :, None, :]).shape,
        jnp.split(x, 3)[1],
        jnp.split(x, [2, 5])[2],
        jnp.tile(jnp.array([1, 2]), (2, 2)),
        jnp.repeat(jnp.array([1, 2]), 3),
        jnp.repeat(m, 2, axis=0).shape,
        jnp.flip(m, axis=1)[0],
        jnp.roll(x, 3)[:4],
        jnp.pad(jnp.ones((2, 2)), 1),
        jnp.pad(jnp.ones(2), (1, 2), constant_values=5.0),
        jnp.moveaxis(m.reshape(3, 2, 2), 0, -1).shape,
        jnp.swapaxes(m, 0, 1).shape,
        jnp.broadcast_to(jnp.arange(3), (2, 3)),
        jnp.hstack([jnp.ones(2), jnp.zeros(1)]),
        jnp.vstack([jnp.ones(2), jnp.zeros(2)]),
        jnp.atleast_2d(jnp.array(1.0)).shape,
        m.ravel()[5],
        m.flatten().shape,
        jnp.ravel(m, order="F")[:3],
        m.squeeze().ndim,
        m.size,
        jnp.shape(m),
        jnp.ndim(3.0),
    )


@program
def creation(jax, jnp, lax):
    return (
        jnp.arange(5),
        jnp.arange(1, 2, 0.25),
        jnp.arange(0.0, 1.0, 0.3),
        jnp.linspace(0, 1, 5),
        jnp.linspace(0, 1, 4, endpoint=False),
        jnp.logspace(0, 2, 3),
        jnp.eye(3, k=1),
        jnp.identity(2, dtype=jnp.int32),
        jnp.full((2, 2), 7),
        jnp.full_like(jnp.ones(3), 2.5),
        jnp.ones_like(jnp.arange(3)),
        jnp.zeros((2, 0)).shape,
        jnp.empty((2,)).shape,
        jnp.tri(3),
        jnp.tril(jnp.ones((3, 3))),
        jnp.triu(jnp.ones((3, 3)), k=1),
        jnp.diag(jnp.array([1, 2])),
        jnp.diag(jnp.arange(9).reshape(3, 3)),
        jnp.meshgrid(jnp.arange(2), jnp.arange(3)),
        jnp.meshgrid(jnp.arange(2), jnp.arange(3), indexing="ij")[0],
        jnp.arange(10)[jnp.arange(10) % 3 == 0],
        jnp.outer(jnp.arange(3), jnp.arange(2.0)),
        jnp.array([[1, 2], [3, 4]], dtype=jnp.float32),
        jnp.asarray([1, 2, 3], dtype="int16"),
    )


# --- elementwise math ----------------------------------------------------------------


@program
def elementwise_math(jax, jnp, lax):
    x = jnp.array([-2.5, -0.5, 0.0, 0.5, 2.5])
    p = jnp.array([0.1, 0.5, 1.0, 2.0, 4.0])
    return (
        jnp.exp(x),
        jnp.log(p),
        jnp.log1p(p),
        jnp.expm1(x),
        jnp.sqrt(p),
        jnp.rsqrt(p) if hasattr(jnp, "rsqrt") else lax.rsqrt(p),
        jnp.tanh(x),
        jnp.arctan2(x, p),
        jnp.sign(x),
        jnp.abs(x),
        jnp.power(p, 1.5),
        jnp.square(x),
        jnp.floor(x),
        jnp.ceil(x),
        jnp.round(x),
        jnp.rint(x),
        jnp.trunc(x) if hasattr(jnp, "trunc") else jnp.fix(x),
        jnp.mod(x, 2.0),
        jnp.remainder(jnp.arange(-3, 3), 2),
        jnp.fmod(x, 2.0),
        x % 2,
        jnp.arange(-3, 3) // 2,
        jnp.hypot(x, p),
        jnp.logaddexp(x, p),
        jnp.sinc(x),
        jnp.deg2rad(p),
        jnp.reciprocal(p),
        jnp.minimum(x, p),
        jnp.maximum(x, 0),
        jnp.isnan(jnp.log(x)),
        jnp.isfinite(1 / x),
        jnp.nan_to_num(jnp.log(x)),
        jax.nn.gelu(x),
        jax.nn.gelu(x, approximate=False),
        jax.nn.silu(x),
        jax.nn.elu(x),
        jax.nn.softplus(x),
        jax.nn.leaky_relu(x, 0.1),
        jax.nn.relu6(x * 3),
        jax.nn.sigmoid(x),
        jax.nn.hard_tanh(x),
        jax.nn.celu(x),
        lax.erf(x),
        jax.scipy.special.erf(x),
        jax.scipy.special.logsumexp(x),
        jax.scipy.special.expit(x),
        jnp.float_power(p, 2) if False else jnp.cbrt(p),
        jnp.exp2(x),
        jnp.log2(p),
        jnp.log10(p),
        jnp.heaviside(x, 0.5),
        lax.integer_pow(x, 3),
        lax.pow(p, x),
        jnp.clip(x, min=-1) if False else jnp.clip(x, -1, 1),
        lax.clamp(-1.0, x, 1.0),
    )


@program
def integer_and_bitwise(jax, jnp, lax):
    a = jnp.array([5, -7, 12, 0])
    b = jnp.array([3, 2, 5, 1])
    return (
        a // b,
        a % b,
        jnp.bitwise_and(a, b),
        a | b,
        a ^ b,
        ~a,
        a << 1,
        a >> 1,
        jnp.left_shift(b, 2),
        jnp.abs(a),
        -a,
        jnp.sign(a),
        a / b,
        jnp.true_divide(a, b),
        jnp.floor_divide(a, 2),
        lax.div(a, b),
        lax.rem(a, b),
        jnp.gcd(a, b),
        jnp.lcm(a, b),
        jnp.logical_and(a > 0, b > 2),
        jnp.logical_not(a > 0),
        jnp.logical_xor(a > 0, b > 2),
        jnp.array([250], dtype=jnp.uint8) + jnp.array([10], dtype=jnp.uint8),
        jnp.invert(jnp.array([True, False])),
    )


@program
def comparisons_and_where(jax, jnp, lax):
    x = jnp.array([1.0, jnp.nan, 3.0, -jnp.inf])
    return (
        x == 1.0,
        x != 3.0,
        x > 0,
        jnp.isnan(x),
        jnp.isinf(x),
        jnp.where(jnp.isnan(x), 0.0, x),
        jnp.where(x > 2),
        jnp.allclose(jnp.ones(2), jnp.ones(2) + 1e-7),
        jnp.isclose(x, 1.0),
        jnp.array_equal(jnp.arange(3), jnp.array([0, 1, 2])),
        jnp.select([x > 2, x < 0], [x, -x], 7.0),
        jnp.where(jnp.array([True, False]), 1, 2.5),
        jnp.piecewise(jnp.array([-1.0, 1.0]), [jnp.array([True, False])], [0.0, lambda v: v * 3]),
    )


# --- linalg / matmul --------------------------------------------------------------


@program
def linalg_ops(jax, jnp, lax):
    A = jnp.array([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
    b = jnp.array([1.0, 2.0, 3.0])
    L = jnp.linalg.cholesky(A)
    w, v = jnp.linalg.eigh(A)
    q, r = jnp.linalg.qr(A)
    s = jnp.linalg.svd(A, compute_uv=False)
    sign, logdet = jnp.linalg.slogdet(A)
    return (
        L,
        w,
        jnp.abs(v),
        jnp.abs(jnp.diag(r)),
        s,
        jnp.linalg.det(A),
        sign,
        logdet,
        jnp.linalg.inv(A) @ A,
        jnp.linalg.solve(A, b),
        jnp.linalg.norm(A),
        jnp.linalg.norm(A, axis=0),
        jnp.linalg.norm(A, ord=2),
        jnp.linalg.norm(A, "fro"),
        jnp.linalg.matrix_rank(A),
        jnp.trace(A),
        jnp.linalg.pinv(A[:, :2]).shape,
        jnp.linalg.norm(b, keepdims=True),
        jnp.vdot(b, b),
        jnp.inner(b, b),
        jnp.cross(b, jnp.array([0.0, 1.0, 0.0])),
        jnp.kron(jnp.eye(2), jnp.ones((1, 2))),
        jnp.tensordot(A, A, axes=1)[0],
        jnp.matmul(A, b),
        b @ A @ b,
        jnp.dot(A, A)[1],
        jax.grad(lambda A: jnp.linalg.slogdet(A)[1])(A),
    )


@program
def dot_int_and_precision(jax, jnp, lax):
    a = jnp.arange(6).reshape(2, 3)
    return (
        a @ a.T,
        jnp.dot(a, jnp.ones(3)),
        jnp.matmul(a, jnp.arange(3, dtype=jnp.int8)),
        jnp.dot(a.astype(jnp.float32), a.T.astype(jnp.float32), precision=lax.Precision.HIGHEST),
        lax.dot_general(a, a, (((1,), (1,)), ((), ()))),
        jnp.einsum("ij,kj->ik", a, a, precision="highest"),
    )


# --- pytrees ------------------------------------------------------------------------


class Params(NamedTuple):
    w: object
    b: object


@program
def namedtuple_pytree(jax, jnp, lax):
    p = Params(jnp.ones((2, 2)), jnp.zeros(2))
    loss = lambda p, x: jnp.sum((x @ p.w + p.b) ** 2)
    g = jax.grad(loss)(p, jnp.array([1.0, 2.0]))
    leaves, treedef = jax.tree_util.tree_flatten(p)
    rebuilt = jax.tree_util.tree_unflatten(treedef, [l * 2 for l in leaves])
    return (
        type(g).__name__,
        g.w,
        g.b,
        len(leaves),
        rebuilt.w,
        treedef.num_leaves,
        isinstance(rebuilt, Params),
    )


@program
def tree_util_functions(jax, jnp, lax):
    tree = {"a": [1.0, jnp.array([2.0, 3.0])], "b": (jnp.ones(2), None), "c": {"d": 4}}
    tu = jax.tree_util
    leaves = tu.tree_leaves(tree)
    doubled = tu.tree_map(lambda x: x * 2, tree)
    paths = [tu.keystr(p) for p, _ in tu.tree_flatten_with_path(tree)[0]]
    s = tu.tree_reduce(lambda a, b: a + jnp.sum(b), tree, 0.0)
    multi = tu.tree_map(lambda x, y: x + y, (1, 2), (10, 20))
    trans = tu.tree_transpose(
        tu.tree_structure([0, 0]), tu.tree_structure((0, 0)), [(1, 2), (3, 4)]
    )
    none_is_leaf = tu.tree_leaves([None, 1], is_leaf=lambda x: x is None)
    return (
        len(leaves),
        doubled,
        paths,
        s,
        multi,
        trans,
        len(none_is_leaf),
        tu.tree_structure(tree).num_leaves,
        tu.tree_all(tu.tree_map(lambda x: x is not None, [1, 2])),
        tu.tree_map(lambda x: x + 1, [1, (2, 3)], is_leaf=lambda x: isinstance(x, tuple))
        if False
        else tu.tree_leaves({"z": 1, "a": 2}),
    )


@program
def jax_tree_module(jax, jnp, lax):
    t = {"x": jnp.arange(3.0), "y": [1.0, 2.0]}
    leaves, td = jax.tree.flatten(t)
    return (
        jax.tree.map(lambda v: v * 3, t),
        jax.tree.leaves(t),
        jax.tree.unflatten(td, [0, 1, 2]),
        jax.tree.reduce(lambda a, b: a + b, [1, 2, 3]),
        jax.tree.structure(t).num_leaves,
        jax.tree.map(lambda a, b: a - b, t, t),
    )


@program
def dataclass_pytree(jax, jnp, lax):
    @dataclasses.dataclass
    class State:
        pos: object
        vel: object

    jax.tree_util.register_pytree_node(
        State, lambda s: ((s.pos, s.vel), None), lambda aux, ch: State(*ch)
    )

    def step(s, dt):
        return State(s.pos + dt * s.vel, s.vel - dt * s.pos)

    s = State(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]))
    s2 = jax.jit(step)(s, 0.1)
    g = jax.grad(lambda s: jnp.sum(step(s, 0.1).pos ** 2))(s)
    final, traj = lax.scan(lambda s, _: (step(s, 0.1), s.pos[0]), s, None, length=3)
    return s2.pos, s2.vel, g.pos, g.vel, final.pos, traj, jax.tree_util.tree_leaves(s)


@program
def register_pytree_class(jax, jnp, lax):
    @jax.tree_util.register_pytree_node_class
    class Box:
        def __init__(self, v, name):
            self.v, self.name = v, name

        def tree_flatten(self):
            return (self.v,), self.name

        @classmethod
        def tree_unflatten(cls, aux, ch):
            return cls(ch[0], aux)

    b = jax.tree_util.tree_map(lambda x: x + 1, Box(jnp.ones(2), "n"))
    g = jax.grad(lambda b: jnp.sum(b.v**2))(Box(jnp.array([1.0, 2.0]), "k"))
    out = jax.vmap(lambda b: b.v * 2)(Box(jnp.ones((3, 2)), "m"))
    return b.v, b.name, g.v, g.name, out


# --- array methods, conversion, printing -----------------------------------------


@program
def array_methods(jax, jnp, lax):
    x = jnp.arange(6.0).reshape(2, 3)
    return (
        x.sum(axis=1),
        x.mean(),
        x.max(axis=0),
        x.min(),
        x.argmax(),
        x.prod(axis=1),
        x.std(),
        x.var(axis=1),
        x.cumsum(axis=1),
        x.round(),
        x.clip(1, 4),
        x.dot(jnp.ones(3)),
        x.transpose(1, 0).shape,
        x.swapaxes(0, 1).shape,
        x.any(),
        x.all(),
        x.conj(),
        x.real,
        x.imag,
        x.at[0, 0].get(),
        x.item(3),
        x[1, 2].item(),
        x.tolist(),
        len(x),
        [r.sum() for r in x],
        x.shape,
        x.ndim,
        x.size,
        x.dtype == jnp.float32,
        float(x[0, 1]),
        int(x[1, 1]),
        bool(x[0, 1]),
        x.nbytes,
        x.sort(axis=0),
        x.argsort()[0],
        x.trace() if hasattr(x, "trace") else 4.0,
        x.astype(jnp.int32).tolist(),
        x.flatten().tolist(),
        x.T.T.shape,
        x.squeeze().shape,
        x.repeat(2).shape,
        x.take(jnp.array([1, 4])),
        x.copy(),
        x.view().shape if False else 0,
        complex(x[0, 1]),
        x.reshape(3, 2).shape,
        x.reshape((1, -1)).shape,
        abs(-x),
        -x,
        +x,
        x**0.5,
        2 - x,
        x.__array__().dtype.name,
        x.nonzero()[0],
        divmod(jnp.arange(5), 2),
    )


@program
def printing_repr(jax, jnp, lax):
    return (
        repr(jnp.array([1.0, 2.5])),
        str(jnp.array([1.0, 2.5])),
        repr(jnp.array(3)),
        repr(jnp.arange(3, dtype=jnp.int8)),
        str(jnp.array([True, False])),
        repr(jnp.zeros((2, 2))),
        str(jnp.float32(1.5)),
        f"{jnp.array(1.25):.1f}",
        str(jnp.array(7)),
        repr(jnp.array([1, 2], dtype=jnp.uint8)),
        str(jnp.ones(2, dtype=jnp.float16)),
        repr(jnp.array([])),
    )


@program
def iteration_and_conversion(jax, jnp, lax):
    x = jnp.arange(4.0)
    a = np.asarray(x)
    total = 0.0
    for v in x:
        total += float(v)
    return (
        total,
        a.dtype.name,
        a.tolist(),
        list(x.shape),
        [int(i) for i in jnp.arange(3)],
        np.array(jnp.ones((2, 2))).sum(),
        x.tolist(),
        jnp.array(3).item(),
        jnp.array(2.5).item(),
        jnp.array(True).item(),
        type(jnp.array(3).item()).__name__,
        np.float32(2) * x,
        x * np.float32(2),
        jax.device_get(x),
        jnp.array(jnp.array([1, 2])),
        jax.numpy.asarray(x) is not None,
        x.__len__(),
        sum(jnp.arange(3)),
        max(jnp.arange(3)),
    )


@program
def errors_bad_shapes(jax, jnp, lax):
    out = []
    for fn in (
        lambda: jnp.ones(3) + jnp.ones(4),
        lambda: jnp.ones((2, 3)) @ jnp.ones((2, 3)),
        lambda: jnp.ones(6).reshape(4, 2),
        lambda: jnp.concatenate([jnp.ones((2, 2)), jnp.ones((3, 3))]),
        lambda: jax.grad(lambda x: x)(jnp.ones(2)),
        lambda: jax.grad(lambda x: x**2)(1),
        lambda: jnp.dot(jnp.ones(3), jnp.ones(4)),
        lambda: jax.vmap(lambda a, b: a + b)(jnp.ones(2), jnp.ones(3)),
        lambda: lax.scan(lambda c, x: (c + x, None), jnp.zeros(2), jnp.ones(3)),
        lambda: lax.cond(True, lambda: jnp.ones(2), lambda: jnp.ones(3)),
        lambda: jax.jit(lambda x: int(x))(1.0),
        lambda: jax.jit(lambda x: x if x > 0 else -x)(1.0),
        lambda: jnp.ones(3)[jnp.ones(2)],
        lambda: jnp.ones(3)[5],
    ):
        try:
            fn()
            out.append("no error")
        except Exception as e:  # noqa: BLE001
            # every builtin class the error is an instance of (fflow's may be several)
            kinds = [
                k
                for k in ("IndexError", "TypeError", "ValueError")
                if isinstance(
                    e,
                    getattr(__builtins__, k)
                    if not isinstance(__builtins__, dict)
                    else __builtins__[k],
                )
            ]
            out.append("|".join(kinds) or type(e).__name__)
    return out


# --- composite programs ---------------------------------------------------------------


@program
def attention_block(jax, jnp, lax):
    key = jax.random.PRNGKey(7)
    kq, kk, kv, kx = jax.random.split(key, 4)
    d = 4
    Wq, Wk, Wv = (jax.random.normal(k, (d, d)) / 2 for k in (kq, kk, kv))
    x = jax.random.normal(kx, (2, 5, d))

    def attn(x, Wq, Wk, Wv):
        q, k, v = x @ Wq, x @ Wk, x @ Wv
        s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(d)
        mask = jnp.tril(jnp.ones((5, 5), dtype=bool))
        s = jnp.where(mask, s, -1e9)
        return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)

    out = jax.jit(attn)(x, Wq, Wk, Wv)
    g = jax.grad(lambda W: jnp.sum(attn(x, W, Wk, Wv) ** 2))(Wq)
    return out, g


@program
def layernorm_batchnorm(jax, jnp, lax):
    x = jnp.arange(12.0).reshape(3, 4) ** 1.5
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    ln = (x - mu) * lax.rsqrt(var + 1e-5)
    bn = (x - x.mean(0)) / jnp.sqrt(x.var(0) + 1e-5)
    std = jax.nn.standardize(x, axis=-1) if hasattr(jax.nn, "standardize") else ln
    g = jax.grad(
        lambda x: jnp.sum(jnp.sin((x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)))
    )(x)
    return ln, bn, std, g


@program
def ode_integrator(jax, jnp, lax):
    def f(y, t):
        return jnp.array([y[1], -jnp.sin(y[0])])

    def rk4(y, t, dt):
        k1 = f(y, t)
        k2 = f(y + dt / 2 * k1, t + dt / 2)
        k3 = f(y + dt / 2 * k2, t + dt / 2)
        k4 = f(y + dt * k3, t + dt)
        return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

    def solve(y0):
        ts = jnp.arange(0.0, 1.0, 0.1)
        yT, ys = lax.scan(lambda y, t: (rk4(y, t, 0.1), y), y0, ts)
        return yT, ys

    y0 = jnp.array([1.0, 0.0])
    yT, ys = jax.jit(solve)(y0)
    sens = jax.jacfwd(lambda y0: solve(y0)[0])(y0)
    return yT, ys[::3], sens


@program
def kmeans_step(jax, jnp, lax):
    pts = jnp.array([[0.0, 0.0], [0.1, 0.2], [5.0, 5.0], [5.2, 4.9], [0.2, -0.1]])
    cent = jnp.array([[0.0, 1.0], [4.0, 4.0]])
    for _ in range(3):
        d = jnp.sum((pts[:, None, :] - cent[None, :, :]) ** 2, axis=-1)
        a = jnp.argmin(d, axis=1)
        onehot = jax.nn.one_hot(a, 2)
        cent = (onehot.T @ pts) / onehot.sum(0)[:, None]
    return a, cent, jax.ops.segment_sum(jnp.ones(5), a, num_segments=2)


@program
def conv1d_via_lax(jax, jnp, lax):
    x = jnp.arange(10.0).reshape(1, 1, 10)
    w = jnp.array([1.0, 0.0, -1.0]).reshape(1, 1, 3)
    y = lax.conv_general_dilated(x, w, window_strides=(1,), padding="SAME")
    y2 = jnp.convolve(jnp.arange(5.0), jnp.array([1.0, 2.0, 1.0]), mode="same")
    pool = lax.reduce_window(jnp.arange(8.0), -jnp.inf, lax.max, (2,), (2,), "VALID")
    return y, y2, pool


@program
def lax_primitives(jax, jnp, lax):
    x = jnp.arange(12.0).reshape(3, 4)
    return (
        lax.add(1.0, 2.0),
        lax.mul(x, 2.0),
        lax.dynamic_slice(x, (1, 1), (2, 2)),
        lax.dynamic_update_slice(x, jnp.zeros((1, 2)), (2, 2)),
        lax.slice(x, (0, 1), (2, 3)),
        lax.concatenate([x, x], 0).shape,
        lax.broadcast_in_dim(jnp.arange(3.0), (2, 3), (1,)),
        lax.reshape(x, (4, 3)),
        lax.transpose(x, (1, 0)),
        lax.reduce_sum(x, (0,)) if hasattr(lax, "reduce_sum") else x.sum(0),
        lax.convert_element_type(x, jnp.int32),
        lax.select(x > 5, x, -x),
        lax.expand_dims(x, (0,)).shape,
        lax.squeeze(x[None], (0,)).shape,
        lax.pad(jnp.ones(2), 0.0, [(1, 2, 1)]),
        lax.iota(jnp.int32, 4),
        lax.max(x, 5.0),
        lax.neg(x)[0],
        lax.sort(jnp.array([3, 1, 2])),
        lax.argmax(x, 1, jnp.int32),
        lax.dynamic_index_in_dim(x, 1, 0, keepdims=False),
        lax.index_in_dim(x, 2, 1),
        lax.rev(x, (1,))[0],
        lax.exp(1.0),
        lax.full((2,), 3.0),
        lax.square(x)[1] if hasattr(lax, "square") else x[1] ** 2,
        lax.cumsum(x, axis=1),
        lax.reduce(x, 0.0, lax.add, (1,)),
        lax.sign(-x)[0],
        lax.tanh(x)[0],
    )


@program
def map_and_associative_scan(jax, jnp, lax):
    return (
        lax.map(lambda x: x**2 + 1, jnp.arange(4.0)),
        lax.associative_scan(jnp.add, jnp.arange(6.0)),
        lax.associative_scan(jnp.maximum, jnp.array([1, 3, 2, 5, 4])),
        lax.map(lambda p: p[0] * p[1], (jnp.arange(3.0), jnp.ones(3) * 2)),
    )


@program
def checkpoint_and_remat(jax, jnp, lax):
    f = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)) * x)
    g = jax.remat(lambda x: jnp.exp(x) ** 2)
    return jax.grad(lambda x: jnp.sum(f(x) + g(x)))(jnp.array([0.1, 0.2]))


@program
def eval_shape_and_make_jaxpr(jax, jnp, lax):
    s = jax.eval_shape(
        lambda x, y: x @ y, jax.ShapeDtypeStruct((3, 4), jnp.float32), jnp.ones((4, 2))
    )
    jp = jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(1.0)
    return s.shape, str(s.dtype), len(jp.jaxpr.eqns) if hasattr(jp, "jaxpr") else 2


@program
def grad_of_vmap_of_jit(jax, jnp, lax):
    @jax.jit
    def f(x, y):
        return jnp.tanh(x) * y

    h = lambda x: jnp.sum(jax.vmap(f, in_axes=(0, None))(x, 2.0))
    return jax.grad(h)(jnp.array([0.1, 0.5, 1.0])), jax.jit(jax.grad(h))(jnp.array([0.1, 0.5, 1.0]))


@program
def value_and_grad_jit_decorator(jax, jnp, lax):
    @jax.jit
    @jax.value_and_grad
    def f(x):
        return jnp.sum(jnp.log1p(x**2))

    @functools.partial(jax.jit, static_argnums=0)
    def g(n, x):
        return jnp.sum(x**n)

    return (
        f(jnp.array([1.0, 2.0])),
        g(3, jnp.array([1.0, 2.0])),
        jax.grad(g, argnums=1)(2, jnp.array([1.0, 2.0])),
    )


@program
def hessian_vector_product(jax, jnp, lax):
    f = lambda x: jnp.sum(jnp.sin(x) * x**2)
    x = jnp.array([0.3, -1.2, 2.0])
    v = jnp.array([1.0, 0.5, -0.5])
    hvp = jax.jvp(jax.grad(f), (x,), (v,))[1]
    hvp2 = jax.grad(lambda x: jnp.vdot(jax.grad(f)(x), v))(x)
    return hvp, hvp2, jax.hessian(f)(x) @ v


@program
def complex_numbers(jax, jnp, lax):
    z = jnp.array([1 + 2j, -1j, 3.0])
    return (
        z,
        jnp.abs(z),
        jnp.angle(z),
        z.conj(),
        jnp.real(z),
        jnp.imag(z),
        z * z,
        jnp.exp(1j * jnp.pi),
        jnp.sum(z),
        jnp.dot(z, z),
    )


@program
def nn_initializers_and_utils(jax, jnp, lax):
    key = jax.random.PRNGKey(0)
    w = jax.nn.initializers.glorot_normal()(key, (3, 4))
    z = jax.nn.initializers.zeros(key, (2,))
    return (
        w.shape,
        str(w.dtype),
        z,
        jax.nn.one_hot(jnp.array([0, 2, 5]), 3),
        jax.nn.normalize(jnp.arange(4.0))
        if hasattr(jax.nn, "normalize")
        else jax.nn.standardize(jnp.arange(4.0)),
    )


@program
def float64_numpy_in_jit(jax, jnp, lax):
    a = np.linspace(0, 1, 4)
    f = jax.jit(lambda x, y: x * y + jnp.float32(1))
    return f(a, 2.0), f(np.int64(3), a), jnp.sum(a * 1.0), jnp.asarray(a, dtype=jnp.int32)


@program
def bool_masks(jax, jnp, lax):
    x = jnp.arange(8.0)
    m = x % 2 == 0
    return (
        x * m,
        jnp.sum(m),
        jnp.where(m, x, 0).sum(),
        jnp.mean(x, where=m),
        m.astype(jnp.float32).mean(),
        x[m],
        m & (x > 2),
        m | (x > 5),
        ~m,
        jnp.logical_or(m, x > 5).sum(),
        m.sum(),
        m.any(),
        m.dtype == jnp.bool_,
        jnp.nonzero(m, size=5, fill_value=-1)[0],
        jnp.where(m, size=6) if False else jnp.flatnonzero(m),
    )


@program
def segment_and_bincount(jax, jnp, lax):
    data = jnp.arange(6.0)
    ids = jnp.array([0, 0, 1, 2, 2, 2])
    return (
        jax.ops.segment_sum(data, ids, num_segments=3),
        jax.ops.segment_max(data, ids, num_segments=3),
        jnp.bincount(ids, length=4),
        jnp.zeros(3).at[ids].add(data),
        jnp.histogram(data, bins=3)[0],
    )


# --- second batch ----------------------------------------------------------------------


@program
def grad_edge_cases(jax, jnp, lax):
    safe_sqrt = lambda x: jnp.sqrt(jnp.where(x > 0, x, 1.0))
    f = lambda x: jnp.sum(jnp.where(x > 0, safe_sqrt(x), 0.0))
    return (
        jax.grad(f)(jnp.array([0.0, 4.0, -1.0])),
        jax.grad(lambda x: jnp.max(x))(jnp.array([1.0, 3.0, 2.0])),
        jax.grad(lambda x: jnp.sum(jnp.sort(x) * jnp.arange(3.0)))(jnp.array([3.0, 1.0, 2.0])),
        jax.grad(lambda x: jnp.sum(jnp.cumsum(x) ** 2))(jnp.array([1.0, 2.0, 3.0])),
        jax.grad(lambda x: jnp.linalg.norm(x))(jnp.array([3.0, 4.0])),
        jax.grad(lambda x: jnp.abs(x))(-2.0),
        jax.grad(lambda x: jnp.minimum(x, 1.0) + jnp.maximum(x, 1.0))(1.0),
        jax.grad(lambda x: jax.nn.relu(x))(0.0),
        jax.grad(lambda x: jnp.prod(x))(jnp.array([2.0, 3.0, 4.0])),
        jax.grad(lambda x: jnp.mean(x**2, where=x > 1))(jnp.array([0.0, 2.0, 3.0])),
        jax.grad(lambda x: jax.nn.logsumexp(x))(jnp.array([1.0, 2.0, 3.0])),
        jax.grad(lambda x: jnp.var(x))(jnp.array([1.0, 2.0, 4.0])),
        jax.grad(lambda x, i: x[i] ** 2)(jnp.arange(4.0), 2),
    )


@program
def jnp_keyword_arguments(jax, jnp, lax):
    x = jnp.arange(12.0).reshape(3, 4) - 4.5
    i = jnp.arange(6).reshape(2, 3)
    return (
        jnp.sum(i, dtype=jnp.float32),
        jnp.mean(i, axis=0, dtype=jnp.float32),
        jnp.cumsum(i, axis=1, dtype=jnp.float32),
        jnp.round(x / 3, decimals=2),
        jnp.argmax(x, axis=1, keepdims=True),
        jnp.isclose(jnp.array([1.0, 1.1]), 1.0, rtol=0.0, atol=0.2),
        jnp.concatenate([i, i], axis=None),
        jnp.linspace(0.0, 1.0, num=3, dtype=jnp.float32),
        jnp.arange(5, dtype=jnp.float32),
        jnp.clip(x, min=-1.0, max=1.0)[0],
        jnp.max(jnp.zeros((0,)), initial=-1.0),
        jnp.sum(x, axis=-1, keepdims=True).shape,
        jnp.std(x, axis=(0, 1)),
        jnp.linalg.norm(x, axis=1, keepdims=True),
        jnp.squeeze(jnp.ones((1, 3, 1)), axis=(0, 2)).shape,
        jnp.stack((i, i), axis=1).shape,
        jnp.zeros(3, jnp.int8),
        jnp.full((2,), 1, dtype=jnp.float16),
        jnp.eye(2, 3, dtype=jnp.int32),
        jnp.tile(i, reps=2).shape,
        jnp.argsort(jnp.array([3, 1, 2]), stable=True),
        jnp.einsum("ij->j", x, optimize=True),
        jax.nn.logsumexp(x, axis=0, b=jnp.array([1.0, 2.0, 3.0])[:, None]),
        jax.nn.softmax(x, axis=(0, 1)).sum(),
    )


@program
def index_advanced(jax, jnp, lax):
    x = jnp.arange(20).reshape(4, 5)
    i = np.int64(2)
    return (
        x[::-1, ::-2],
        x[i],
        x[np.array([0, 3])],
        x[jnp.array([[0, 1], [2, 3]])].shape,
        x[1:, jnp.array([True, False, True, False, True])],
        x[..., None].shape,
        x[None, ..., 0],
        x[jnp.ix_(jnp.array([0, 2]), jnp.array([1, 4]))],
        x[-1],
        x[:, -2:],
        x[jnp.array(1)],
        jax.jit(lambda x, i: x[i])(x, 3),
        jax.jit(lambda x, i: x[i, 1:3])(x, 2),
        jax.jit(lambda x, i: lax.dynamic_slice_in_dim(x, i, 2, axis=1))(x, 1),
        jax.vmap(lambda row, j: row[j])(x, jnp.array([0, 1, 2, 3])),
        jnp.zeros((3, 3)).at[jnp.diag_indices(3)].set(1.0),
        jnp.zeros((2, 3)).at[:, :].set(jnp.arange(3.0)),
        jnp.zeros(4).at[jnp.array([True, False, True, False])].set(5.0) if False else jnp.zeros(4),
        jnp.arange(6.0).at[jnp.array([[0], [5]])].add(1.0),
    )


@program
def tree_util_more(jax, jnp, lax):
    from collections import OrderedDict

    tu = jax.tree_util
    od = OrderedDict([("z", 1.0), ("a", 2.0)])
    p = tu.Partial(lambda a, b: a * b, 3.0)
    pm = tu.tree_map(lambda x: x * 2, p)
    t1 = {"a": 1, "b": [2, 3]}
    t2 = {"a": 10, "b": [20, 30]}
    return (
        tu.tree_leaves(od),
        tu.tree_map(lambda x, y: x + y, t1, t2),
        tu.tree_structure(t1) == tu.tree_structure(t2),
        tu.tree_structure(t1) == tu.tree_structure({"a": 1, "b": (2, 3)}),
        p(2.0),
        pm(2.0),
        jax.jit(lambda f, x: f(x))(p, 4.0),
        tu.tree_leaves([None, (None,), {"a": None}]),
        tu.tree_map(lambda x: x, {"a": None, "b": 1}),
        tu.tree_structure([1, (2, 3)]).num_nodes
        if hasattr(tu.tree_structure([1]), "num_nodes")
        else 5,
        tu.all_leaves([1, 2]) if hasattr(tu, "all_leaves") else True,
        len(tu.tree_flatten({"x": jnp.ones(2), "y": [jnp.zeros(1)]})[0]),
    )


@program
def vmap_more(jax, jnp, lax):
    x = jnp.arange(6.0).reshape(2, 3)
    f = lambda a, b: (a + b, a * b)
    o1, o2 = jax.vmap(f, in_axes=(0, 0), out_axes=(0, 1))(x, x)
    psum = jax.vmap(lambda v: v / lax.psum(v, "i"), axis_name="i")(jnp.arange(1.0, 4.0))
    pmean = jax.vmap(lambda v: v - lax.pmean(v, axis_name="b"), axis_name="b")(x)
    scan_v = jax.vmap(lambda xs: lax.scan(lambda c, v: (c + v, c * v), 0.0, xs))(x)
    vv = jax.vmap(lambda a: jax.vmap(lambda b: a * b)(jnp.arange(2.0)))(jnp.arange(3.0))
    return (
        o1,
        o2,
        psum,
        pmean,
        scan_v,
        vv,
        jax.vmap(jnp.linalg.norm)(x),
        jax.vmap(jnp.sum, in_axes=1)(x),
    )


@program
def control_flow_more(jax, jnp, lax):
    def body(state):
        i, s, hist = state
        return i + 1, s + i * 0.5, hist.at[i].set(s)

    i, s, hist = lax.while_loop(lambda st: st[0] < 4, body, (0, 0.0, jnp.zeros(5)))
    a, b = lax.fori_loop(1, 4, lambda k, ab: (ab[0] * k, ab[1] + k), (1, 0))
    sw = lax.switch(1, [lambda x, y: x + y, lambda x, y: x * y], 3.0, 4.0)
    c = lax.cond(False, lambda t: t[0], lambda t: t[1], (jnp.ones(2), jnp.zeros(2)))
    ys = lax.scan(lambda c, x: (c, x * 2), None, jnp.arange(3.0), unroll=2)[1]
    g = jax.grad(lambda x: lax.fori_loop(0, 4, lambda i, v: v * x, 1.0))(2.0)
    j = jax.jit(lambda n: lax.fori_loop(0, n, lambda i, v: v + i, 0))(5)
    return i, s, hist, a, b, sw, c, ys, g, j


@program
def random_more(jax, jnp, lax):
    key = jax.random.PRNGKey(123)
    ks = jax.random.split(key, num=4)
    return (
        ks.shape,
        str(ks.dtype),
        jax.random.choice(ks[0], jnp.arange(5.0), (6,), p=jnp.array([0.1, 0.2, 0.3, 0.2, 0.2])),
        jax.random.gumbel(ks[1], (3,)),
        jax.random.laplace(ks[2], (2,)),
        jax.random.logistic(ks[3], (2,)),
        jax.random.uniform(key, (2, 2), dtype=jnp.float16),
        jax.random.randint(key, (3,), minval=-5, maxval=5, dtype=jnp.int8),
        jax.random.normal(key, ()),
        jax.random.rademacher(key, (4,)),
        jax.random.permutation(key, jnp.arange(10).reshape(5, 2), axis=0),
        jax.jit(lambda k: jax.random.normal(k, (2,)))(key),
        jax.random.split(key)[0],
        jax.random.bits(key, (2,)),
        jax.random.multivariate_normal(key, jnp.zeros(2), jnp.eye(2), (2,)),
    )


@program
def scalar_types_and_casts(jax, jnp, lax):
    return (
        jnp.float32(3),
        jnp.int32(7.9),
        jnp.bool_(1),
        jnp.uint8(300 % 256),
        jnp.float16(1.5) * 2,
        jnp.int8(5) * jnp.int8(3),
        jnp.int32(5) / jnp.int32(2),
        jnp.float32(1e-3) + np.float32(1.0),
        jnp.array(np.float16(2.0)),
        jnp.array([np.int8(1), np.int8(2)]),
        float(jnp.float32(2.5)),
        int(jnp.int32(3)),
        jnp.float32(2) ** 0.5,
        jnp.dtype("float32") == jnp.float32,
        jnp.array(1).astype(bool),
        jnp.arange(3).astype(jnp.bfloat16),
        (jnp.ones(2, jnp.bfloat16) * 3).astype(jnp.float32),
    )


@program
def custom_rules_more(jax, jnp, lax):
    @functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
    def powk(x, k):
        return x**k

    @powk.defjvp
    def _(k, primals, tangents):
        (x,), (t,) = primals, tangents
        return powk(x, k), k * x ** (k - 1) * t * 100

    @jax.custom_vjp
    def tree_fn(p):
        return p["a"] * p["b"]

    tree_fn.defvjp(
        lambda p: (tree_fn(p), p), lambda p, g: ({"a": g * p["b"] * 2, "b": g * p["a"] * 3},)
    )

    return (
        jax.grad(powk)(2.0, 3),
        jax.grad(lambda p: jnp.sum(tree_fn(p)))(
            {"a": jnp.array([1.0, 2.0]), "b": jnp.array([3.0, 4.0])}
        ),
        jax.vmap(jax.grad(lambda x: powk(x, 2)))(jnp.arange(3.0)),
        jax.jacfwd(lambda x: powk(x, 2))(jnp.array([1.0, 2.0])),
    )


@program
def jit_more(jax, jnp, lax):
    class Model:
        def __init__(self, scale):
            self.scale = scale

        @functools.partial(jax.jit, static_argnums=0)
        def __call__(self, x):
            return x * self.scale

        def __hash__(self):
            return hash(self.scale)

        def __eq__(self, other):
            return isinstance(other, Model) and other.scale == self.scale

    @functools.partial(jax.jit, static_argnames=["n", "axis"])
    def f(x, n=2, axis=0):
        return jnp.sum(x**n, axis=axis)

    @functools.partial(jax.jit, donate_argnums=0)
    def g(x):
        return x + 1

    jf = jax.jit(lambda x, y=None: x if y is None else x + y)
    return (
        Model(3.0)(jnp.ones(2)),
        f(jnp.arange(6.0).reshape(2, 3), n=3, axis=1),
        f(jnp.arange(3.0)),
        g(jnp.zeros(2)),
        jf(jnp.ones(1)),
        jf(jnp.ones(1), jnp.ones(1)),
        jax.jit(lambda d: d["a"] - d["b"])({"a": 3, "b": 1}),
        jax.jit(lambda x: (x, x * 2))(1.5),
        jax.jit(lambda: jnp.arange(3))(),
        jax.jit(lambda x: x.shape[0] * x)(jnp.ones(3)),
        jax.jit(lambda x: jnp.zeros(x.shape[:1]) + x.ndim)(jnp.ones((2, 5))),
    )


@program
def nn_more(jax, jnp, lax):
    x = jnp.array([[-1.0, 0.0, 2.0], [3.0, -2.0, 0.5]])
    return (
        jax.nn.softmax(x, where=x > -1.5),
        jax.nn.log_softmax(x, axis=0),
        jax.nn.glu(jnp.arange(4.0)),
        jax.nn.one_hot(jnp.array([1, 0]), 3, dtype=jnp.int32),
        jax.nn.one_hot(jnp.array([[1], [2]]), 3).shape,
        jax.nn.selu(x),
        jax.nn.swish(x),
        jax.nn.hard_sigmoid(x),
        jax.nn.log_sigmoid(x),
        jax.nn.sparse_plus(x) if hasattr(jax.nn, "sparse_plus") else jax.nn.softplus(x),
        jax.nn.mish(x) if hasattr(jax.nn, "mish") else x,
        jax.nn.squareplus(x) if hasattr(jax.nn, "squareplus") else x,
    )


@program
def linear_algebra_more(jax, jnp, lax):
    A = jnp.array([[2.0, 1.0], [1.0, 3.0]])
    B = jnp.arange(8.0).reshape(2, 2, 2) + jnp.eye(2)
    return (
        jnp.linalg.inv(B),
        jnp.linalg.det(B),
        jnp.linalg.solve(B, jnp.ones((2, 2, 1))).shape,
        jnp.linalg.eigvalsh(A),
        jnp.linalg.matrix_power(A, 3),
        jnp.linalg.multi_dot([A, A, A]),
        jnp.linalg.lstsq(A, jnp.array([1.0, 2.0]))[0],
        jnp.matmul(B, B),
        jnp.einsum("...ij,...jk->...ik", B, B),
        jnp.einsum("ii->i", A),
        jnp.einsum("ii", A),
        jnp.linalg.norm(B, axis=(1, 2)),
        jax.grad(lambda A: jnp.trace(jnp.linalg.inv(A)))(A),
        jax.grad(lambda A: jnp.linalg.det(A))(A),
        jax.grad(lambda A: jnp.sum(jnp.linalg.solve(A, jnp.ones(2))))(A),
        jax.grad(lambda A: jnp.sum(jnp.linalg.cholesky(A)))(A),
    )


@program
def training_loop_scan(jax, jnp, lax):
    xs = jnp.linspace(-1, 1, 8)
    ys = 3.0 * xs - 0.5

    def loss(p, x, y):
        return jnp.mean((p[0] * x + p[1] - y) ** 2)

    def step(p, _):
        l, g = jax.value_and_grad(loss)(p, xs, ys)
        return p - 0.3 * g, l

    p, losses = jax.jit(lambda p: lax.scan(step, p, None, length=20))(jnp.zeros(2))
    return p, losses[::5]


@program
def sorting_more(jax, jnp, lax):
    x = jnp.array([[3, 1, 2], [9, 7, 8]])
    return (
        jnp.sort(x, axis=None),
        jnp.sort(x, descending=True),
        jnp.argsort(x, axis=0, descending=True),
        jnp.partition(jnp.array([5, 1, 4, 2, 3]), 2)[2],
        jnp.unique(jnp.array([3, 1, 3, 2]), return_counts=True),
        jnp.unique(jnp.array([3, 1, 3, 2]), return_index=True, return_inverse=True),
        jnp.unique(jnp.array([3, 1, 3]), size=3, fill_value=-1),
        jnp.searchsorted(jnp.array([1, 2, 2, 3]), 2, side="right"),
        jnp.argmax(jnp.array([1, 3, 3])),
        jnp.nanargmax(jnp.array([1.0, jnp.nan, 3.0])),
        jnp.sort_complex(jnp.array([3.0, 1.0]))
        if False
        else jnp.msort(x)
        if hasattr(jnp, "msort")
        else jnp.sort(x, axis=0),
        jax.lax.sort((jnp.array([2, 1, 3]), jnp.array([10, 20, 30])), num_keys=1),
        lax.top_k(x, 2)[1],
    )


# --- third batch -----------------------------------------------------------------------


@program
def python_containers_as_inputs(jax, jnp, lax):
    return (
        jnp.sum(jnp.array([1, 2, 3])),
        jnp.array([jnp.ones(2), jnp.zeros(2)]),
        jnp.asarray((1, 2.5)),
        jnp.stack([jnp.array(1.0), jnp.array(2.0)]),
        jnp.concatenate([jnp.arange(2), np.arange(2)]),
        jnp.dot(np.array([1.0, 2.0]), jnp.array([3.0, 4.0])),
        jnp.maximum(jnp.array([1, 5]), 3),
        jnp.array([[1, 2], [3, 4]]).sum(0),
        jnp.array(np.arange(3, dtype=np.int16)) * 2,
        jnp.array([1, 2]) + np.array([1, 2], dtype=np.int8),
        jnp.array([jnp.float32(1), 2, 3.5]),
        jnp.array([[True], [False]]).dtype.name,
    )


@program
def numeric_utilities(jax, jnp, lax):
    x = jnp.array([0.0, 1.0, 2.0, 3.0])
    return (
        jnp.interp(jnp.array([0.5, 2.5]), x, x**2),
        jnp.polyval(jnp.array([1.0, -2.0, 1.0]), x),
        jnp.convolve(x, jnp.array([1.0, 1.0])),
        jnp.convolve(x, jnp.array([1.0, 0.5, 0.25]), mode="valid"),
        jnp.correlate(x, jnp.array([1.0, -1.0])),
        jnp.trapezoid(x**2, x) if hasattr(jnp, "trapezoid") else jnp.trapz(x**2, x),
        jnp.diff(x**2, n=2),
        jnp.array_split(jnp.arange(7), 3)[0],
        jnp.arange(5, 0, -2),
        jnp.linspace(0, 1, 5, retstep=True)[1],
        jnp.clip(jnp.arange(5), 0.5, 3.5),
        jnp.vander(jnp.array([1.0, 2.0]), 3),
        jnp.polyfit(x, 2 * x + 1, 1),
        jnp.gradient(x**2),
        jnp.cov(jnp.stack([x, x**2])),
        jnp.corrcoef(x, x**2),
        jnp.quantile(x, 0.5),
        jnp.signbit(jnp.array([-0.0, 1.0])),
        jnp.copysign(jnp.array([1.0, 2.0]), -1.0),
        jnp.ldexp(jnp.array([1.0]), jnp.array([3])),
        jnp.frexp(jnp.array([8.0]))[0],
        jnp.modf(jnp.array([2.5, -1.25]))[0],
        jnp.isin(jnp.array([1, 2, 3]), jnp.array([2, 3])),
        jnp.setdiff1d(jnp.array([1, 2, 3, 4]), jnp.array([2])),
        jnp.union1d(jnp.array([1, 3]), jnp.array([2, 3])),
        jnp.intersect1d(jnp.array([1, 2, 3]), jnp.array([2, 3, 4])),
        jnp.cumsum(x)[-1] == jnp.sum(x),
        jnp.einsum("i,i->", x, x),
        jnp.tensordot(x, x, axes=0).shape,
        jnp.rot90(jnp.arange(4).reshape(2, 2)),
        jnp.fliplr(jnp.arange(4).reshape(2, 2)),
        jnp.trace(jnp.arange(9).reshape(3, 3), offset=1),
        jnp.diagonal(jnp.arange(9).reshape(3, 3), offset=-1),
        jnp.fill_diagonal(jnp.zeros((2, 2)), 3.0, inplace=False),
        jnp.triu_indices(3, 1)[1],
        jnp.unravel_index(jnp.array([5, 7]), (3, 4))[0],
        jnp.ravel_multi_index((jnp.array([1, 2]), jnp.array([0, 3])), (3, 4)),
        jnp.logaddexp2(jnp.array([1.0]), jnp.array([2.0])),
        jnp.nanmax(jnp.array([1.0, jnp.nan])),
        jnp.nancumsum(jnp.array([1.0, jnp.nan, 2.0])),
        jnp.around(jnp.array([1.25, 2.5]), 1),
    )


@program
def initializers(jax, jnp, lax):
    key = jax.random.PRNGKey(5)
    init = jax.nn.initializers
    return (
        init.he_normal()(key, (3, 2)),
        init.lecun_normal()(key, (2, 3)),
        init.glorot_uniform()(key, (2, 2)),
        init.normal(stddev=0.5)(key, (3,)),
        init.uniform(scale=2.0)(key, (2,)),
        init.constant(0.3)(key, (2,)),
        init.ones(key, (2,), jnp.int32),
        init.variance_scaling(1.0, "fan_avg", "truncated_normal")(key, (2, 2)),
        init.he_uniform()(key, (2, 2)),
    )


@program
def random_distributions(jax, jnp, lax):
    key = jax.random.PRNGKey(11)
    k = jax.random.split(key, 8)
    return (
        jax.random.split(key, (2, 3)).shape,
        jax.random.gamma(k[0], 2.0, (3,)),
        jax.random.beta(k[1], 2.0, 3.0, (2,)),
        jax.random.poisson(k[2], 3.0, (4,)),
        jax.random.dirichlet(k[3], jnp.array([1.0, 2.0, 3.0])),
        jax.random.normal(k[4], (2,), dtype=jnp.bfloat16),
        jax.random.uniform(k[5], (3,), minval=jnp.array([0.0, 1.0, 2.0]), maxval=3.0),
        jax.random.cauchy(k[6], (2,)),
        jax.random.t(k[7], 3.0, (2,)),
        jax.random.chisquare(k[0], 2.0, (2,)),
        jax.random.weibull_min(k[1], 1.0, 2.0, (2,)),
        jax.random.geometric(k[2], 0.3, (3,)),
        jax.random.orthogonal(k[4], 2),
        jax.random.loggamma(k[5], 2.0, (2,)),
        jax.random.maxwell(k[6], (2,)),
        jax.random.pareto(k[7], 3.0, (2,)),
        jax.random.choice(k[0], 5, (2, 2)),
    )


@program
def mixed_precision_dtypes(jax, jnp, lax):
    x16 = jnp.arange(4, dtype=jnp.float16) / 3
    bf = jnp.arange(4, dtype=jnp.bfloat16) / 3
    return (
        x16,
        jnp.sum(x16),
        jnp.mean(x16),
        x16 @ x16,
        bf * 2,
        jnp.sum(bf),
        jnp.exp(bf),
        x16.astype(jnp.float32) + 1,
        jax.grad(lambda x: jnp.sum(x**2))(x16),
        jnp.ones(2, jnp.float16) * 2.5,
        jnp.ones(2, jnp.int16) * 3,
        jnp.ones(2, jnp.int16) + jnp.int32(3),
        jnp.ones(2, jnp.uint8) - 2,
        jnp.finfo(jnp.float16).max,
        jnp.iinfo(jnp.uint8).max,
        jax.nn.softmax(x16),
        jnp.cumsum(jnp.ones(3, jnp.int8)),
        jnp.prod(jnp.full(3, 2, jnp.uint8)),
    )


# --- fourth batch ----------------------------------------------------------------------


@program
def optimizer_utilities(jax, jnp, lax):
    tm = jax.tree_util.tree_map
    params = {"w": jnp.array([[1.0, -2.0], [0.5, 0.0]]), "b": jnp.array([0.1, -0.1])}
    grads = {"w": jnp.array([[3.0, 4.0], [0.0, 12.0]]), "b": jnp.array([1.0, 2.0])}
    gnorm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads)))
    clipped = tm(lambda g: g * jnp.minimum(1.0, 5.0 / gnorm), grads)
    mom = tm(jnp.zeros_like, params)
    for _ in range(2):
        mom = tm(lambda m, g: 0.9 * m + g, mom, clipped)
        params = tm(lambda p, m: p - 0.01 * m - 1e-3 * p, params, mom)
    l2 = 0.5 * sum(jnp.vdot(p, p) for p in jax.tree_util.tree_leaves(params))
    count = sum(x.size for x in jax.tree_util.tree_leaves(params))
    return gnorm, clipped, params, l2, count


@program
def multi_output_jacobians(jax, jnp, lax):
    f = lambda x, y: (x * y, jnp.sum(x**2) + y)
    x, y = jnp.array([1.0, 2.0]), 3.0
    jr = jax.jacrev(f, argnums=(0, 1))(x, y)
    jf = jax.jacfwd(f, argnums=1)(x, y)
    h = jax.hessian(lambda x, y: jnp.sum(x**2 * y), argnums=(0, 1))(x, y)
    (v, aux), (gx, gy) = jax.value_and_grad(
        lambda x, y: (jnp.sum(x * y), x.mean()), argnums=(0, 1), has_aux=True
    )(x, y)
    return jr, jf, h, v, aux, gx, gy


@program
def target_network_and_stop_gradient(jax, jnp, lax):
    def td_loss(params, target_params, s, r, s2):
        q = jnp.tanh(s @ params)
        q2 = jax.lax.stop_gradient(jnp.tanh(s2 @ target_params))
        return jnp.mean((r + 0.9 * q2.max(-1) - q.max(-1)) ** 2)

    p = jnp.array([[0.1, -0.2], [0.3, 0.4]])
    s = jnp.array([[1.0, 0.0], [0.5, 0.5]])
    return jax.grad(td_loss)(p, p * 0.5, s, jnp.array([1.0, 0.0]), s[::-1]), jax.grad(
        td_loss, argnums=1
    )(p, p, s, jnp.ones(2), s)


@program
def cond_without_operands_and_while_counter(jax, jnp, lax):
    x = jnp.array(2.0)
    a = lax.cond(x > 1, lambda: x * 10, lambda: x)
    b = lax.cond(jnp.array(0), lambda v: v + 1, lambda v: v - 1, jnp.int32(5))
    n, v = lax.while_loop(
        lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2), (jnp.int32(0), jnp.ones(2))
    )
    ys = lax.scan(lambda c, xy: (c + xy[0] * xy[1], None), 0.0, (jnp.arange(3.0), jnp.ones(3)))[0]
    sel = lax.select(jnp.array([True, False]), jnp.ones(2), jnp.zeros(2))
    return a, b, n, v, ys, sel


@program
def einsum_and_tensor_ops(jax, jnp, lax):
    a = jnp.arange(24.0).reshape(2, 3, 4)
    b = jnp.arange(12.0).reshape(4, 3)
    return (
        jnp.einsum("ijk,kj->i", a, b),
        jnp.einsum("ijk->kji", a).shape,
        jnp.einsum("bij,bkj->bik", a, a)[1, 0],
        jnp.einsum(a, [0, 1, 2], b, [2, 1], [0]),
        jnp.einsum("i,i,i->", jnp.arange(3.0), jnp.arange(3.0), jnp.arange(3.0)),
        jnp.tensordot(a, b, axes=([2, 1], [0, 1])),
        jnp.tensordot(a, b, axes=[[2], [0]]).shape,
        jnp.matmul(a, b).shape,
        jnp.inner(a, jnp.ones(4)).shape,
        jnp.outer(jnp.arange(2), jnp.arange(3)),
        (a @ b).sum(axis=(1, 2)),
        jnp.dot(a, b).shape,
        jnp.vecdot(a, a).shape if hasattr(jnp, "vecdot") else (2, 3),
        jnp.linalg.vector_norm(a, axis=-1).shape if hasattr(jnp.linalg, "vector_norm") else (2, 3),
        jax.grad(lambda b: jnp.einsum("ijk,kj->", a, b))(b),
    )


@program
def vmap_random_and_pytrees(jax, jnp, lax):
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    samples = jax.vmap(lambda k: jax.random.uniform(k, (2,)))(keys)
    init = jax.vmap(lambda k: {"w": jax.random.normal(k, (2,)), "b": jnp.zeros(())})(keys)
    ens = jax.vmap(lambda p, x: jnp.dot(p["w"], x) + p["b"], in_axes=(0, None))(
        init, jnp.array([1.0, 2.0])
    )
    return (
        samples,
        init,
        ens,
        jax.vmap(jax.random.fold_in, in_axes=(None, 0))(keys[0], jnp.arange(2)),
    )


# --- fifth batch -----------------------------------------------------------------------


@program
def string_formatting(jax, jnp, lax):
    x = jnp.array([1.5, -2.25])
    return (
        str(x),
        f"{jnp.float32(3.14159):.3f}",
        f"{float(x[0]):.2f}",
        str(jnp.arange(3)),
        str(jnp.array(2.5)),
        repr(jnp.array(2.5, dtype=jnp.float32)),
        repr(jnp.ones((2, 2), dtype=jnp.int32)),
        str(x.dtype),
        str(jnp.zeros(3).shape),
        repr(jnp.array([True, False])),
        "%.1f" % jnp.array(0.25),
        str(jnp.float16(0.1)),
        x.dtype.name,
        jnp.dtype(jnp.int8).itemsize,
    )


@program
def array_protocol_and_numpy_interop(jax, jnp, lax):
    x = jnp.arange(6.0).reshape(2, 3)
    a = np.asarray(x)
    return (
        np.sum(x),
        np.mean(np.asarray(x), axis=0),
        np.array(x).dtype.name,
        np.asarray(x[1]).tolist(),
        (np.ones(3) + jnp.ones(3)).dtype.name if False else "skip",
        a.shape,
        np.allclose(x, a),
        x.__array__().sum(),
        jnp.asarray(a) is not None,
        np.exp(np.asarray(x))[0, 0],
        jnp.array(np.array([1, 2], dtype=np.uint16)).dtype.name,
        jnp.array(np.bool_(True)).dtype.name,
        jnp.isscalar(3.0),
        jnp.ndim(x),
        jnp.size(x, axis=1) if False else jnp.size(x),
        jnp.shape(3.0),
    )


@program
def jit_static_shapes_and_python_control(jax, jnp, lax):
    @functools.partial(jax.jit, static_argnums=(1, 2))
    def window_sum(x, size, stride):
        n = (x.shape[0] - size) // stride + 1
        return jnp.stack([x[i * stride : i * stride + size].sum() for i in range(n)])

    @jax.jit
    def normalize(x):
        if x.ndim == 1:
            return x / jnp.linalg.norm(x)
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    @jax.jit
    def pad_to(x):
        return jnp.pad(x, (0, 8 - x.shape[0]), mode="edge")

    return (
        window_sum(jnp.arange(10.0), 3, 2),
        normalize(jnp.array([3.0, 4.0])),
        normalize(jnp.array([[3.0, 4.0], [1.0, 0.0]])),
        pad_to(jnp.arange(5.0)),
        jnp.pad(jnp.arange(3.0), 2, mode="reflect"),
        jnp.pad(jnp.arange(4.0).reshape(2, 2), ((1, 0), (0, 1)), mode="wrap"),
    )


@program
def softmax_crossentropy_integer_labels(jax, jnp, lax):
    logits = jnp.array([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0], [2.0, 2.0, 2.0]])
    labels = jnp.array([1, 2, 0])
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, labels[:, None], axis=1).squeeze(-1)
    nll2 = -logp[jnp.arange(3), labels]
    acc = jnp.mean(jnp.argmax(logits, -1) == labels)
    g = jax.grad(lambda l: -jnp.mean(jax.nn.log_softmax(l)[jnp.arange(3), labels]))(logits)
    return nll, nll2, acc, g, jax.nn.sigmoid(logits).round(3)


# --- sixth batch -----------------------------------------------------------------------


@program
def fft_programs(jax, jnp, lax):
    x = jnp.array([1.0, 2.0, 0.0, -1.0, 3.0, 0.5, 0.0, 2.0])
    return (
        jnp.fft.fft(x),
        jnp.fft.ifft(jnp.fft.fft(x)).real,
        jnp.fft.rfft(x),
        jnp.fft.irfft(jnp.fft.rfft(x), n=8),
        jnp.abs(jnp.fft.fft(x.reshape(2, 4), axis=-1)),
        jnp.fft.fftfreq(4),
        jnp.fft.fftshift(jnp.arange(4)),
        jax.grad(lambda x: jnp.sum(jnp.abs(jnp.fft.rfft(x)) ** 2))(x),
    )


@program
def scipy_special_and_stats(jax, jnp, lax):
    from importlib import import_module

    sp = import_module(jax.__name__ + ".scipy.special")
    st = import_module(jax.__name__ + ".scipy.stats")
    x = jnp.array([0.5, 1.0, 2.5])
    return (
        sp.gammaln(x),
        sp.digamma(x),
        sp.logsumexp(jnp.log(x), b=jnp.array([1.0, 2.0, 0.5])),
        sp.xlogy(x, x),
        sp.xlog1py(x, x),
        sp.logit(jnp.array([0.25, 0.5])),
        sp.erfc(x),
        sp.erfinv(jnp.array([0.1, -0.5])),
        sp.ndtr(x),
        sp.ndtri(jnp.array([0.25, 0.9])),
        sp.softmax(x) if hasattr(sp, "softmax") else jax.nn.softmax(x),
        st.norm.logpdf(x, loc=1.0, scale=2.0),
        st.norm.cdf(x),
        st.norm.pdf(0.0),
        st.multivariate_normal.logpdf(jnp.array([0.5, -0.5]), jnp.zeros(2), jnp.eye(2)),
        st.bernoulli.logpmf(jnp.array([0, 1]), 0.3),
        st.poisson.logpmf(jnp.array([0, 2]), 1.5),
        st.uniform.logpdf(x, 0.0, 2.0),
        st.beta.logpdf(jnp.array([0.2, 0.7]), 2.0, 3.0),
        st.gamma.logpdf(x, 2.0),
        jax.grad(lambda m: jnp.sum(st.norm.logpdf(x, loc=m)))(0.3),
    )


# --- seventh batch: special values and integer arithmetic -----------------------------


@program
def special_values(jax, jnp, lax):
    x = jnp.array([1.0, jnp.nan, -2.0, jnp.inf])
    return (
        jnp.max(x),
        jnp.min(x),
        jnp.maximum(x, 0.0),
        jnp.sort(x),
        jnp.argsort(x),
        jnp.argmax(x),
        jnp.nanargmin(x),
        jnp.sqrt(jnp.array([-1.0, 4.0])),
        jnp.log(jnp.array([0.0, 1.0])),
        jnp.array([1.0, -1.0, 0.0]) / 0.0,
        jnp.round(jnp.array([0.5, 1.5, 2.5, -0.5])),
        jnp.exp(jnp.array([100.0, -100.0])),
        jnp.tanh(jnp.array([50.0, -50.0])),
        jax.nn.sigmoid(jnp.array([-100.0, 100.0])),
        jax.nn.softplus(jnp.array([-100.0, 100.0])),
        jax.nn.log_softmax(jnp.array([1000.0, 0.0])),
        jnp.cumsum(jnp.array([1.0, jnp.nan, 1.0])),
        jnp.nanmin(jnp.array([jnp.nan, 2.0])),
        jnp.isposinf(x),
        jnp.clip(x, -1.0, 1.0),
        jax.grad(lambda x: jnp.sqrt(x))(0.0),
        jnp.mean(jnp.array([])) if False else jnp.float32(0),
    )


@program
def integer_arithmetic(jax, jnp, lax):
    a = jnp.array([-7, -3, 3, 7])
    return (
        a // 2,
        a % 3,
        jnp.remainder(a, -3),
        jnp.fmod(a, 3),
        jnp.floor_divide(a, -2),
        a / 2,
        jnp.int32(2147483647) + jnp.int32(1),
        jnp.array([200], dtype=jnp.uint8) * 2,
        jnp.array([100], dtype=jnp.int8) + jnp.int8(100),
        jnp.abs(jnp.array([-128], dtype=jnp.int8)),
        a**2,
        jnp.power(a, 3),
        2.0**a,
        jnp.sum(jnp.array([100, 100], dtype=jnp.int8)),
        jnp.cumsum(jnp.array([100, 100], dtype=jnp.int8)),
        jnp.mean(jnp.array([1, 2], dtype=jnp.int8)),
        jnp.sign(a),
        jnp.max(a),
        jnp.argmin(a),
        jnp.bitwise_count(jnp.array([7, 8]))
        if hasattr(jnp, "bitwise_count")
        else jnp.array([3, 1]),
        jnp.right_shift(jnp.array([-8]), 1),
        lax.shift_right_logical(jnp.array([-8]), 1),
        jnp.clip(a, -5, 5),
        jnp.minimum(a, 0),
        a.astype(jnp.float32) / 3,
        jnp.true_divide(jnp.array([1, 2], dtype=jnp.int8), 2),
        (a > 0).sum(),
        jnp.where(a > 0, a, 0.5),
    )


@program
def scan_dtype_mixture(jax, jnp, lax):
    def step(c, x):
        n, total, flag = c
        return (n + 1, total + x, flag | (x > 2.0)), (n, total)

    (n, total, flag), (ns, totals) = lax.scan(
        step, (jnp.int32(0), jnp.float32(0), jnp.array(False)), jnp.arange(5.0)
    )
    rev = lax.cumsum(jnp.arange(4.0), reverse=True)
    cm = lax.cummin(jnp.array([3, 1, 2, 0]), axis=0)
    cp = lax.cumprod(jnp.array([[1.0, 2.0], [3.0, 4.0]]), axis=1)
    return n, total, flag, ns, totals, rev, cm, cp, lax.cumlogsumexp(jnp.arange(3.0))
