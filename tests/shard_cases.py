"""Example invocations of every primitive for the signature tests (tests/test_shard_*.py).

`CASES[name](draw)` returns (args, params) with NumPy inputs in the primitive's
domain; shapes come from hypothesis so uneven splits are common.
"""

import numpy as np
from hypothesis import strategies as st

f32 = np.float32


def shape(draw, min_rank=1, max_rank=3, min_dim=1, max_dim=6):
    rank = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.integers(min_dim, max_dim)) for _ in range(rank))


def arr(draw, shp, lo=-2.0, hi=2.0, dtype=f32):
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.uniform(lo, hi, size=shp).astype(dtype)
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, size=shp).astype(bool)
    return rng.integers(int(lo), int(hi), size=shp).astype(dtype)


def unary(lo=-2.0, hi=2.0, dtype=f32, **params):
    def case(draw):
        return [arr(draw, shape(draw), lo, hi, dtype)], dict(params)

    return case


def binary(lo=-2.0, hi=2.0, lo2=None, hi2=None, dtype=f32):
    def case(draw):
        s = shape(draw)
        y_lo = lo if lo2 is None else lo2
        y_hi = hi if hi2 is None else hi2
        return [arr(draw, s, lo, hi, dtype), arr(draw, s, y_lo, y_hi, dtype)], {}

    return case


def reduction(dtype=f32, arg=False):
    def case(draw):
        s = shape(draw)
        if arg:
            axes = (draw(st.integers(0, len(s) - 1)),)
            return [arr(draw, s, dtype=dtype)], dict(axes=axes, index_dtype=np.dtype(np.int32))
        axes = tuple(sorted(draw(st.sets(st.integers(0, len(s) - 1), min_size=1))))
        return [arr(draw, s, dtype=dtype)], dict(axes=axes)

    return case


def cumulative(lo=-2.0, hi=2.0):
    def case(draw):
        s = shape(draw)
        return [arr(draw, s, lo, hi)], dict(
            axis=draw(st.integers(0, len(s) - 1)), reverse=draw(st.booleans())
        )

    return case


def dot_general(draw):
    b = draw(st.integers(1, 4))
    m, k, n = (draw(st.integers(1, 6)) for _ in range(3))
    if draw(st.booleans()):
        return [arr(draw, (m, k)), arr(draw, (k, n))], dict(
            dimension_numbers=(((1,), (0,)), ((), ())), preferred_element_type=None
        )
    return [arr(draw, (b, m, k)), arr(draw, (b, k, n))], dict(
        dimension_numbers=(((2,), (1,)), ((0,), (0,))), preferred_element_type=None
    )


def broadcast_in_dim(draw):
    a, b = draw(st.integers(1, 6)), draw(st.integers(2, 6))
    lead = draw(st.integers(1, 4))
    return [arr(draw, (a, 1))], dict(shape=(lead, a, b), broadcast_dimensions=(1, 2))


def reshape(draw):
    a, b, c = (draw(st.integers(1, 5)) for _ in range(3))
    if draw(st.booleans()):
        return [arr(draw, (a, b * c))], dict(new_sizes=(a, b, c))
    return [arr(draw, (a, b, c))], dict(new_sizes=(a * b, c))


def transpose(draw):
    s = shape(draw, 2, 3)
    perm = tuple(draw(st.permutations(range(len(s)))))
    return [arr(draw, s)], dict(permutation=perm)


def squeeze(draw):
    a, b = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    return [arr(draw, (a, 1, b))], dict(dimensions=(1,))


def slice_(draw):
    s = shape(draw, 1, 2, 2, 7)
    starts, limits, strides = [], [], []
    for d in s:
        a = draw(st.integers(0, d - 1))
        b = draw(st.integers(a + 1, d))
        starts.append(a)
        limits.append(b)
        strides.append(draw(st.integers(1, 2)))
    return [arr(draw, s)], dict(
        start_indices=tuple(starts), limit_indices=tuple(limits), strides=tuple(strides)
    )


def pad(draw):
    s = shape(draw, 2, 2)
    cfg = ((0, 0, 0), (draw(st.integers(0, 2)), draw(st.integers(-1, 2)), draw(st.integers(0, 1))))
    return [arr(draw, s), np.asarray(1.5, f32)], dict(padding_config=cfg)


def concatenate(draw):
    a, b, c = (draw(st.integers(1, 5)) for _ in range(3))
    return [arr(draw, (a, b)), arr(draw, (a, c))], dict(dimension=1)


def rev(draw):
    s = shape(draw, 2, 3)
    return [arr(draw, s)], dict(dimensions=(0,))


def iota(draw):
    s = shape(draw, 1, 3)
    return [], dict(dtype=np.dtype(np.int32), shape=s, dimension=draw(st.integers(0, len(s) - 1)))


def dynamic_slice(draw):
    a, b = draw(st.integers(1, 6)), draw(st.integers(2, 6))
    size = draw(st.integers(1, b))
    start = np.asarray(draw(st.integers(-1, b)), np.int32)
    return [arr(draw, (a, b)), np.asarray(0, np.int32), start], dict(slice_sizes=(a, size))


def dynamic_update_slice(draw):
    a, b = draw(st.integers(1, 6)), draw(st.integers(2, 6))
    size = draw(st.integers(1, b))
    start = np.asarray(draw(st.integers(0, b)), np.int32)
    return [arr(draw, (a, b)), arr(draw, (a, size)), np.asarray(0, np.int32), start], {}


def gather(draw):
    n, m, k = draw(st.integers(1, 7)), draw(st.integers(1, 5)), draw(st.integers(1, 6))
    idx = arr(draw, (k, 1), -1, n + 1, np.int32)
    return [arr(draw, (n, m)), idx], dict(axes=(0,))


def take_along_axis(draw):
    s = shape(draw, min_rank=1, max_rank=3)
    axis = draw(st.integers(0, len(s) - 1))
    ishape = s[:axis] + (draw(st.integers(1, 5)),) + s[axis + 1 :]
    idx = arr(draw, ishape, -1, s[axis] + 1, np.int32)  # out of range clamps
    return [arr(draw, s), idx], dict(axis=axis)


def scatter_add_along_axis(draw):
    (x, idx), params = take_along_axis(draw)
    return [x, idx, arr(draw, idx.shape)], params


def scatter(unique=False):
    def case(draw):
        n, m, k = draw(st.integers(1, 7)), draw(st.integers(1, 5)), draw(st.integers(1, 6))
        if unique:
            k = min(k, n)
            idx = np.random.default_rng(draw(st.integers(0, 99))).permutation(n)[:k]
            idx = idx.reshape(k, 1).astype(np.int32)
        else:
            idx = arr(draw, (k, 1), 0, n, np.int32)
        return [arr(draw, (n, m)), idx, arr(draw, (k, m))], dict(axes=(0,))

    return case


def select_n(draw):
    s = shape(draw)
    return [arr(draw, s, dtype=bool), arr(draw, s), arr(draw, s)], {}


def sort(draw):
    s = shape(draw, 1, 2)
    return [arr(draw, s)], dict(dimension=draw(st.integers(0, len(s) - 1)), num_keys=1)


def random_bits(draw):
    key = np.asarray([draw(st.integers(0, 2**32 - 1)), 7], np.uint32)
    return [key], dict(shape=shape(draw, 1, 2))


def random_fold_in(draw):
    n = draw(st.integers(1, 5))
    keys = arr(draw, (n, 2), 0, 2**31, np.uint32)
    return [keys, arr(draw, (n,), 0, 1000, np.uint32)], {}


def convert(draw):
    return [arr(draw, shape(draw))], dict(new_dtype=np.dtype(np.float64), weak_type=False)


def stacked(kind):
    def case(draw):
        b, n = draw(st.integers(1, 5)), draw(st.integers(1, 4))
        a = arr(draw, (b, n, n))
        spd = a @ np.swapaxes(a, -1, -2) + n * np.eye(n, dtype=f32)
        if kind == "solve":
            return [spd, arr(draw, (b, n, 2))], {}
        if kind in ("cholesky", "eigh", "slogdet"):
            return [spd.astype(f32)], {}
        return [a], {}

    return case


def rfft_case(draw):
    b, n = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    return [arr(draw, (b, n))], dict(fft_type="rfft", fft_lengths=(n,))


POS = dict(lo=0.2, hi=3.0)
UNIT = dict(lo=-0.9, hi=0.9)

CASES = {
    "abs": unary(),
    "acos": unary(**UNIT),
    "acosh": unary(lo=1.1, hi=3.0),
    "asin": unary(**UNIT),
    "asinh": unary(),
    "atan": unary(),
    "atanh": unary(**UNIT),
    "cbrt": unary(),
    "ceil": unary(),
    "cos": unary(),
    "cosh": unary(),
    "erf": unary(),
    "erf_inv": unary(**UNIT),
    "lgamma": unary(**POS),
    "fft": rfft_case,
    "digamma": unary(**POS),
    "polygamma": unary(**POS, n=1),
    "exp": unary(),
    "exp2": unary(),
    "expm1": unary(),
    "floor": unary(),
    "is_finite": unary(),
    "log": unary(**POS),
    "log1p": unary(**POS),
    "logistic": unary(),
    "neg": unary(),
    "round": unary(),
    "round_even": unary(),
    "rsqrt": unary(**POS),
    "sign": unary(),
    "sin": unary(),
    "sinh": unary(),
    "sqrt": unary(**POS),
    "square": unary(),
    "stop_gradient": unary(),
    "tan": unary(**UNIT),
    "tanh": unary(),
    "copy": unary(),
    "not": unary(lo=-5, hi=5, dtype=np.int32),
    "integer_pow": unary(y=3),
    "add": binary(),
    "sub": binary(),
    "mul": binary(),
    "div": binary(lo2=0.5, hi2=2.0),
    "rem": binary(lo2=0.5, hi2=2.0),
    "pow": binary(lo=0.2, hi=2.0),
    "max": binary(),
    "min": binary(),
    "atan2": binary(),
    "nextafter": binary(),
    "eq": binary(lo=-2, hi=2, dtype=np.int32),
    "ne": binary(lo=-2, hi=2, dtype=np.int32),
    "lt": binary(),
    "le": binary(),
    "gt": binary(),
    "ge": binary(),
    "and": binary(lo=0, hi=8, dtype=np.int32),
    "or": binary(lo=0, hi=8, dtype=np.int32),
    "xor": binary(lo=0, hi=8, dtype=np.int32),
    "shift_left": binary(lo=0, hi=8, dtype=np.int32),
    "shift_right_logical": binary(lo=0, hi=8, dtype=np.uint32),
    "shift_right_arithmetic": binary(lo=-8, hi=8, dtype=np.int32),
    "select_n": select_n,
    "convert_element_type": convert,
    "reduce_sum": reduction(),
    "reduce_max": reduction(),
    "reduce_min": reduction(),
    "reduce_prod": reduction(),
    "reduce_or": reduction(dtype=bool),
    "reduce_and": reduction(dtype=bool),
    "argmax": reduction(arg=True),
    "argmin": reduction(arg=True),
    "cumsum": cumulative(),
    "cumprod": cumulative(),
    "cummax": cumulative(),
    "cummin": cumulative(),
    "dot_general": dot_general,
    "broadcast_in_dim": broadcast_in_dim,
    "reshape": reshape,
    "transpose": transpose,
    "squeeze": squeeze,
    "slice": slice_,
    "pad": pad,
    "concatenate": concatenate,
    "rev": rev,
    "iota": iota,
    "dynamic_slice": dynamic_slice,
    "dynamic_update_slice": dynamic_update_slice,
    "gather": gather,
    "scatter": scatter(unique=True),
    "scatter_add": scatter(),
    "take_along_axis": take_along_axis,
    "scatter_add_along_axis": scatter_add_along_axis,
    "scatter_mul": scatter(unique=True),
    "scatter_min": scatter(),
    "scatter_max": scatter(),
    "sort": sort,
    "random_bits": random_bits,
    "random_fold_in": random_fold_in,
    "linalg_solve": stacked("solve"),
    "cholesky": stacked("cholesky"),
    "eigh": stacked("eigh"),
    "svd": stacked("svd"),
    "qr": stacked("qr"),
    "slogdet": stacked("slogdet"),
}

# primitives whose signatures are tested elsewhere, with the place
ELSEWHERE = {
    "cond": "all-B control flow, test_shard_transform.py::test_control_flow_runs_broadcast",
    "while": "all-B control flow, test_shard_transform.py::test_control_flow_runs_broadcast",
    "scan": "all-B control flow, test_shard_transform.py::test_control_flow_runs_broadcast",
    "sbp_constraint": "with_sbp, test_shard_transform.py",
    **{
        name: "dot_product_attention's tangent map and its transpose share its SBP rule "
        "(primitives/attention.py _sbp_rule); tests/test_op_db.py checks that rule's "
        "signatures from the dot_product_attention row, not these two one by one"
        for name in ("attention_jvp", "attention_bwd")
    },
    "shard_call": "the sharded call itself, test_shard_transform.py",
    **{
        name: "a collective over a named vmap axis: vmap evaluates it (test_vmap_named.py); "
        "it never reaches a program that shard runs"
        for name in ("psum", "pmax", "pmin", "all_gather_axis", "axis_index")
    },
}
