"""Programs the planner is measured on (benchmarks/bench_planner.py, tests/test_planner_*.py).

A pre-LN transformer training step: per layer layernorm -> multi-head attention ->
residual -> layernorm -> GELU MLP -> residual; a mean-squared loss; `grad` of it and
one Adam update (the state is (m, v) per parameter). `megatron_sbp` annotates the
weights as Megatron-LM does (wq/wk/wv/w1 column-split S(1), wo/w2 row-split S(0));
`hand_megatron` is the same step with every activation SBP forced by `with_sbp`.
"""

import types

import numpy as np

import fflow
import fflow.numpy as fnp
from fflow.sharding import B, S

# the library the model is written in: fflow here, JAX in bench_planner.py
FFLOW = types.SimpleNamespace(
    np=fnp,
    rsqrt=fflow.lax.rsqrt,
    softmax=fflow.nn.softmax,
    gelu=fflow.nn.gelu,
    value_and_grad=fflow.value_and_grad,
)

LAYER_KEYS = ("g1", "b1", "wq", "wk", "wv", "wo", "g2", "b2", "w1", "w2")
MEGATRON = {"wq": S(1), "wk": S(1), "wv": S(1), "wo": S(0), "w1": S(1), "w2": S(0)}


def init(n_layers, d, seed=0, heads=None):
    rng = np.random.default_rng(seed)

    def w(*s):
        return (rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32)

    layers = []
    for _ in range(n_layers):
        layers.append(
            {
                "g1": np.ones(d, np.float32),
                "b1": np.zeros(d, np.float32),
                "wq": w(d, d),
                "wk": w(d, d),
                "wv": w(d, d),
                "wo": w(d, d),
                "g2": np.ones(d, np.float32),
                "b2": np.zeros(d, np.float32),
                "w1": w(d, 4 * d),
                "w2": w(4 * d, d),
            }
        )
    return layers


def data(b, t, d, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(b, t, d)).astype(np.float32)
    y = rng.normal(size=(b, t, d)).astype(np.float32)
    return x, y


def _ln(lib, x, g, b):
    jnp = lib.np
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lib.rsqrt(var + 1e-5) * g + b


def _hint(x, sbp, hints):
    """`hints` (the hand plan): None, or a function from the model-axis SBP to the
    value's N-D SBP (1-D: itself; 2-D data x model: (S(0), sbp))."""
    return fflow.with_sbp(x, hints(sbp)) if hints else x


def one_d(sbp):
    return sbp


def data_model(sbp):
    return (S(0), sbp)


def sequence(sbp):
    """Megatron with sequence parallelism (Korthikanti et al.): a block's output is
    reduce-scattered along the sequence instead of all-reduced, so layernorms and
    residuals run split along t (all-gathered again before the next column matmul)."""
    return S(1) if sbp == B else sbp


def layer(p, x, heads, hints=None, lib=FFLOW):
    jnp = lib.np
    bsz, t, d = x.shape
    dh = d // heads
    h = _ln(lib, x, p["g1"], p["b1"])

    def split_heads(z):
        z = _hint(z, S(2), hints)
        return jnp.transpose(jnp.reshape(z, (bsz, t, heads, dh)), (0, 2, 1, 3))

    q, k, v = (split_heads(h @ p[n]) for n in ("wq", "wk", "wv"))
    logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.float32(np.sqrt(dh))
    probs = lib.softmax(logits, axis=-1)
    a = jnp.einsum("bhqk,bhkd->bhqd", probs, v)
    a = jnp.reshape(jnp.transpose(a, (0, 2, 1, 3)), (bsz, t, d))
    a = _hint(a, S(2), hints)
    x = x + _hint(a @ p["wo"], B, hints)
    h = _ln(lib, x, p["g2"], p["b2"])
    m = _hint(lib.gelu(h @ p["w1"]), S(2), hints)
    return x + _hint(m @ p["w2"], B, hints)


def loss(params, x, y, heads=4, hints=None, lib=FFLOW):
    for p in params:
        x = layer(p, x, heads, hints, lib)
    return lib.np.mean(lib.np.square(x - y))


def train_step(params, opt, x, y, heads=4, hints=None, lr=1e-3, lib=FFLOW):
    """One Adam step (bias correction folded into lr): returns (loss, params, opt)."""
    jnp = lib.np
    value, grads = lib.value_and_grad(loss)(params, x, y, heads, hints, lib)
    b1, b2, eps = 0.9, 0.999, 1e-8
    new_p, new_o = [], []
    for p, (m, v), g in zip(params, opt, grads):
        np_, nm, nv = {}, {}, {}
        for k in p:
            nm[k] = b1 * m[k] + (1 - b1) * g[k]
            nv[k] = b2 * v[k] + (1 - b2) * jnp.square(g[k])
            np_[k] = p[k] - lr * nm[k] / (jnp.sqrt(nv[k]) + eps)
        new_p.append(np_)
        new_o.append((nm, nv))
    return value, new_p, new_o


def adam_init(params):
    return [({k: np.zeros_like(a) for k, a in p.items()},) * 2 for p in params]


def megatron_sbp(params, mesh2d=False):
    """in_sbp for train_step(params, opt, x, y): Megatron weights, their Adam state alike;
    on a 2-D mesh, mesh axis 0 splits the batch and axis 1 the model."""
    if mesh2d:
        w = [{k: (B, MEGATRON.get(k, B)) for k in p} for p in params]
        batch = (S(0), B)
    else:
        w = [{k: MEGATRON.get(k, B) for k in p} for p in params]
        batch = B
    return (w, [(wi, wi) for wi in w], batch, batch)


def step_fn(heads, hints=None, adam=True):
    if adam:
        return lambda params, opt, x, y: train_step(params, opt, x, y, heads, hints)
    return lambda params, x, y: fflow.value_and_grad(loss)(params, x, y, heads, hints)


def megatron_sharded(pl, n_layers, b, t, d, heads=4, hints=False, adam=True, keep=False, **opts):
    """(Sharded step, args) with Megatron weight annotations (hints=True: the hand plan,
    every activation's SBP forced by with_sbp; hints="sequence" on a 1-D mesh: the hand
    plan with sequence parallelism; keep=True: the weights' and their Adam state's
    annotations are binding, `shard(..., keep_in_sbp=)`, the batch's are not)."""
    if keep:
        opts["keep_in_sbp"] = (True, True, False, False) if adam else (True, False, False)
    params = init(n_layers, d)
    x, y = data(b, t, d)
    mesh2d = pl.ndim == 2
    if hints == "sequence" and not mesh2d:
        hints = sequence
    elif hints:
        hints = data_model if mesh2d else one_d
    fn = step_fn(heads, hints or None, adam)
    sbp = megatron_sbp(params, mesh2d)
    if adam:
        # the next step gets params and state as this one did
        out = ((B,) * pl.ndim, sbp[0], sbp[1])
        step = fflow.shard(fn, pl, in_sbp=sbp, out_sbp=out, **opts)
        return step, (params, adam_init(params), x, y)
    step = fflow.shard(
        fn, pl, in_sbp=(sbp[0], sbp[2], sbp[3]), out_sbp=((B,) * pl.ndim, sbp[0]), **opts
    )
    return step, (params, x, y)
