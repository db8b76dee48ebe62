"""jit's cache-hit path for pytree arguments (one walk, one flat key) and its output
rebuild: every answer is compared with the untransformed function."""

import collections

import numpy as np
import pytest

import fflow
import fflow.numpy as jnp

_P = collections.namedtuple("_P", "u v")


def _same(a, b):
    """`a` (jit's) has `b`'s pytree types and structure and equal leaves; a plain
    dict comes back with sorted keys (as from JAX), others in their own order."""
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == (sorted(b) if type(b) is dict else list(b))
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif a is None:
        assert b is None
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _kind(p):  # the structure decides the numbers: a wrong cache hit shows
    if isinstance(p, dict):
        return 10.0 * len(p) + sum(ord(str(k)[0]) for k in p)
    if p is None:
        return -1.0
    return (2.0 if isinstance(p, list) else 3.0) * len(p)


def f(p, x):
    leaves = fflow.tree_util.tree_leaves(p)
    return x * _kind(p) + sum(leaves[:1]) if leaves else x * _kind(p)


@pytest.mark.filterwarnings("ignore::fflow.transforms.jit.RetraceWarning")
def test_structures_with_equal_leaves_never_share_a_cache_entry():
    a, b, x = jnp.ones(3), jnp.full(3, 2.0), jnp.arange(3.0)
    jf = fflow.jit(f)
    trees = [
        [a, b],
        (a, b),
        [a, [b]],
        [[a], b],
        [a, b, None],
        [None, a, b],
        {"u": a, "v": b},
        {"u": a, "w": b},
        {"w": a, "u": b},
        {1: a, 2: b},
        collections.OrderedDict([("v", a), ("u", b)]),
        None,
        [],
        (),
        {},
    ]
    for _ in range(3):  # the first pass traces, the others hit the cache
        for t in trees:
            _same(jf(t, x), f(t, x))
    assert jf.trace_count == len(trees)


def test_leaf_signatures_in_pytrees_retrace():
    x = jnp.arange(3.0)
    jf = fflow.jit(lambda p, x: [p[0][0] * x, p[1]])
    base = [(jnp.ones(3),), jnp.ones(2)]
    variants = [
        [(jnp.ones(3, jnp.int32),), jnp.ones(2)],  # dtype
        [(jnp.ones(3),), jnp.ones((1, 2))],  # shape
        [(jnp.ones(3),), jnp.asarray(2.0)],  # rank 0
    ]
    for t in [base] + variants + [base] + variants:
        _same(jf(t, x), [t[0][0] * x, t[1]])
    assert jf.trace_count == 1 + len(variants)


def test_donated_pytree_leaves_are_deleted_on_every_call():
    def step(params, x):
        return [(w - x, b * 2) for w, b in params], x.sum()

    jstep = fflow.jit(step, donate_argnums=0)
    ref = [(np.ones(3), np.zeros(2)), (np.full(3, 2.0), np.ones(2))]
    ref = [tuple(v.astype(np.float32) for v in wb) for wb in ref]
    params = [tuple(jnp.asarray(v) for v in wb) for wb in ref]
    x = jnp.arange(3.0)
    for _ in range(4):
        old = params
        params, s = jstep(params, x)
        ref, _ = step(ref, np.arange(3.0, dtype=np.float32))
        assert all(leaf.is_deleted() for leaf in fflow.tree_util.tree_leaves(old))
        assert not x.is_deleted()
        _same(params, [tuple(jnp.asarray(v, jnp.float32) for v in wb) for wb in ref])
        assert float(s) == 3.0
    assert jstep.trace_count == 1
    with pytest.raises(RuntimeError, match="donated"):
        jstep(old, x)


def test_donation_of_the_second_argument_only():
    jf = fflow.jit(lambda a, b: (a["k"] + b[0], b[1] * 2), donate_argnums=(1,))
    for _ in range(3):
        a, b = {"k": jnp.ones(2)}, [jnp.ones(2), jnp.ones(2)]
        out = jf(a, b)
        assert not a["k"].is_deleted()
        assert b[0].is_deleted() and b[1].is_deleted()
        _same(out, (jnp.full(2, 2.0), jnp.full(2, 2.0)))


@pytest.mark.parametrize(
    "make",
    [
        lambda x: [x, (x + 1,), None, {"b": x * 2, "a": [x]}],
        lambda x: {3: x, 1: (x, x * 3)},
        lambda x: (x,),
        lambda x: [],
        lambda x: ([], {}, ()),
        lambda x: _P(x, x + 1),
        lambda x: collections.OrderedDict([("z", x), ("a", x + 1)]),
    ],
)
def test_outputs_rebuild_the_functions_own_pytree(make):
    jf = fflow.jit(make)
    x = jnp.arange(2.0)
    for _ in range(2):
        out = jf(x)
        _same(out, make(x))
    if isinstance(out, list):
        out.append(1)  # each call returns its own containers
        _same(jf(x), make(x))


def test_numpy_and_python_leaves_are_copied_and_keyed_by_what_they_become():
    from fflow.experimental import enable_x64

    jf = fflow.jit(lambda p, s: [p[0] * s + p[1], p[1]])
    x = np.full(2, 3.0)  # float64: float32 unless x64 is on, as in JAX
    p = [jnp.ones(2), x]
    for s in (2.0, 2.0, 5, np.float32(4.0)):
        out = jf(p, s)
        _same(out, [jnp.asarray(np.ones(2) * s + 3.0, jnp.float32), jnp.asarray(x, jnp.float32)])
    out[1]._value[0] = 7.0  # the output holds a copy, never the caller's buffer
    assert x[0] == 3.0
    assert jf.trace_count == 3  # float and int scalars are weak; a NumPy scalar is not
    with enable_x64():  # only x's Array differs from the last call's
        out = jf([jnp.ones(2, jnp.float32), x], np.float32(4.0))
        assert out[1].dtype == np.float64 and out[0].dtype == np.float64
    assert jf.trace_count == 4
    assert jf([jnp.ones(2), x], np.float32(4.0))[1].dtype == np.float32
    assert jf.trace_count == 4


@fflow.tree_util.register_pytree_node_class
class _Scaled:
    """A registered class: children (w, b), aux (scale, tag); the aux decides numbers."""

    def __init__(self, w, b, scale, tag=None):
        self.w, self.b, self.scale, self.tag = w, b, scale, tag

    def tree_flatten(self):
        return (c for c in (self.w, self.b)), (self.scale, self.tag)  # a generator

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)

    def __call__(self, x):
        return (x * self.w + self.b) * self.scale


_State = collections.namedtuple("_State", "count mu")


def _apply(m, s, x):
    return m(x) + s.mu, _Scaled(m.w * 2, m.b, m.scale + 1, m.tag), _State(s.count + 1, s.mu)


def _leaves_equal(a, b):
    la, ta = fflow.tree_util.tree_flatten(a)
    lb, tb = fflow.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_registered_classes_and_namedtuples_take_the_fast_path_by_their_aux():
    jf = fflow.jit(_apply)
    x, w, b = jnp.arange(3.0), jnp.ones(3), jnp.full(3, 0.5, jnp.float32)
    state = _State(jnp.asarray(0), jnp.zeros(3))
    calls = [(_Scaled(w, b, 2.0), state), (_Scaled(w, b, 3.0), state),
             (_Scaled(w, b, 2.0, "t"), state), (_Scaled(w, b, 2.0), state)]  # fmt: skip
    for m, s in calls + calls:
        out = jf(m, s, x)
        _leaves_equal(out, _apply(m, s, x))
        assert type(out[1]) is _Scaled and type(out[2]) is _State
        assert out[1].scale == m.scale + 1 and out[1].tag == m.tag  # aux rebuilt
    assert jf.trace_count == 3  # scale 2.0, 3.0 and tag "t": three entries


@fflow.tree_util.register_pytree_node_class
class _Bag:
    """A registered class with any number of children and a constant aux."""

    def __init__(self, *items):
        self.items = items

    def tree_flatten(self):
        return list(self.items), "bag"

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def _bag_fn(bag):  # the nesting decides the numbers
    return sum(
        (k + 1) * (_bag_fn(c) if isinstance(c, _Bag) else c) for k, c in enumerate(bag.items)
    )


def test_registered_nodes_with_other_child_counts_never_share_an_entry():
    a, b = jnp.ones(2), jnp.full(2, 10.0, jnp.float32)
    bags = [_Bag(_Bag(a), b), _Bag(_Bag(a, b)), _Bag(a, b), _Bag(_Bag(a, b), _Bag())]
    jf = fflow.jit(_bag_fn)
    for bag in bags + bags:
        np.testing.assert_array_equal(jf(bag), _bag_fn(bag))
    assert jf.trace_count == len(bags)


def test_unhashable_aux_takes_the_generic_path_and_agrees():
    jf = fflow.jit(_apply)
    x, w, b = jnp.arange(3.0), jnp.ones(3), jnp.zeros(3)
    state = _State(jnp.asarray(0), jnp.zeros(3))
    for scale in (2.0, 2.0):
        m = _Scaled(w, b, scale, ["a list"])  # unhashable aux
        out = jf(m, state, x)
        _leaves_equal(out, _apply(m, state, x))
    assert jf.trace_count == 1


def test_nn_module_and_optimizer_state_step_matches_the_untransformed_step():
    from fflow import nn, optim

    model = nn.MLP(4, 3, width_size=8, depth=2, activation=nn.relu, key=fflow.random.PRNGKey(0))
    tx = optim.adam(1e-2)
    x, y = jnp.ones((5, 4)), jnp.ones((5, 3))

    def step(model, opt_state):
        loss, g = fflow.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        updates, opt_state = tx.update(g, opt_state, model)
        return optim.apply_updates(model, updates), opt_state, loss

    jstep = fflow.jit(step)
    m1 = m2 = model
    s1 = s2 = tx.init(model)
    for _ in range(3):
        m1, s1, l1 = jstep(m1, s1)
        m2, s2, l2 = step(m2, s2)
        _leaves_equal((m1, s1, l1), (m2, s2, l2))
    assert jstep.trace_count == 1 and type(m1) is type(model)
