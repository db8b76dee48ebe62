"""More `jax.lax` names, written over fflow.lax and fflow.numpy: `top_k`, `reduce`,
`reduce_window`, `Precision`, `conv_general_dilated` (re-exported by `fflow.lax`).

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import lax
    >>> [v.tolist() for v in lax.top_k(jnp.array([3.0, 1.0, 4.0]), 2)]
    [[4.0, 3.0], [2, 0]]
"""

import enum
import itertools

import fflow.numpy as jnp
from fflow import lax_ops as lax
from fflow.errors import user_error
from fflow.lax_control import associative_scan
from fflow.tree_util import tree_flatten, tree_unflatten

__all__ = [
    "Precision",
    "conv_general_dilated",
    "cumlogsumexp",
    "reduce",
    "reduce_window",
    "top_k",
]


def cumlogsumexp(operand, axis=0, reverse=False):
    """Cumulative log-sum-exp along `axis` (an associative scan of logaddexp, as JAX)."""

    return associative_scan(jnp.logaddexp, jnp.asarray(operand), reverse=reverse, axis=axis)


class Precision(enum.Enum):
    """Matmul precision hint (`lax.Precision.HIGHEST`); the NumPy backend always
    computes in the operands' dtype, so every value gives the same numbers."""

    DEFAULT = 0
    HIGH = 1
    HIGHEST = 2

    def __str__(self):
        return self.name


def top_k(operand, k):
    """(values, indices) of the `k` largest entries along the last axis, largest first
    (ties: lower index first, as JAX)."""

    operand = jnp.asarray(operand)
    k = int(k)
    if not 0 <= k <= operand.shape[-1]:
        raise user_error(ValueError, f"top_k: k={k} out of range for last axis {operand.shape}")
    idx = jnp.argsort(operand, axis=-1, descending=True)[..., :k]
    return jnp.take_along_axis(operand, idx, axis=-1), idx


def _monoid(computation):
    """The fflow.numpy reduction matching a known binary `computation`, else None."""

    table = {
        lax.add: jnp.sum,
        jnp.add: jnp.sum,
        lax.max: jnp.max,
        jnp.maximum: jnp.max,
        lax.min: jnp.min,
        jnp.minimum: jnp.min,
        lax.mul: jnp.prod,
        jnp.multiply: jnp.prod,
        lax.bitwise_or: jnp.any,
        jnp.logical_or: jnp.any,
        lax.bitwise_and: jnp.all,
        jnp.logical_and: jnp.all,
    }
    try:
        return table.get(computation)
    except TypeError:  # unhashable callable
        return None


def reduce(operands, init_values, computation, dimensions):  # noqa: A001
    """Reduce `operands` over `dimensions` with the binary `computation`, starting at
    `init_values` (JAX's `lax.reduce`; one operand or a tuple of operands)."""

    ops, treedef = tree_flatten(operands)
    inits = tree_flatten(init_values)[0]
    dims = tuple(sorted(int(d) for d in dimensions))
    if len(ops) == 1:
        x, init = jnp.asarray(ops[0]), inits[0]
        red = _monoid(computation)
        if red is not None:
            r = red(x, axis=dims).astype(x.dtype)
            return computation(r, jnp.full(r.shape, init, dtype=x.dtype))  # lax: equal shapes
    # general case: fold `computation` over the reduced positions, one slice at a time
    xs = [jnp.asarray(o) for o in ops]
    keep = [d for d in range(xs[0].ndim) if d not in dims]
    xs = [
        jnp.transpose(x, dims + tuple(keep)).reshape((-1,) + tuple(x.shape[d] for d in keep))
        for x in xs
    ]
    acc = [jnp.full(x.shape[1:], i, x.dtype) for x, i in zip(xs, inits)]
    for j in range(xs[0].shape[0]):
        cur = [x[j] for x in xs]
        if len(xs) == 1:
            acc = [computation(acc[0], cur[0])]
        else:
            acc = list(computation(tuple(acc), tuple(cur)))
    return acc[0] if len(xs) == 1 else tree_unflatten(treedef, acc)


def _padding_pairs(padding, shape, window, strides, dilation=None):
    dilation = dilation or (1,) * len(shape)
    if isinstance(padding, str):
        pads = []
        for n, w, s, d in zip(shape, window, strides, dilation):
            w = (w - 1) * d + 1
            if padding.upper() == "VALID":
                pads.append((0, 0))
            else:  # SAME
                out = -(-n // s)
                total = max((out - 1) * s + w - n, 0)
                pads.append((total // 2, total - total // 2))
        return pads
    return [tuple(int(v) for v in p) for p in padding]


def reduce_window(operand, init_value, computation, window_dimensions, window_strides,
                  padding, base_dilation=None, window_dilation=None):  # fmt: skip
    """Reduce each window of `operand` with `computation` (JAX's `lax.reduce_window`),
    e.g. max pooling: `reduce_window(x, -inf, lax.max, (2, 2), (2, 2), "VALID")`."""

    x = jnp.asarray(operand)
    nd = x.ndim
    wd = tuple(window_dilation or (1,) * nd)
    bd = tuple(base_dilation or (1,) * nd)
    if not len(window_dimensions) == len(window_strides) == len(wd) == len(bd) == nd:
        raise user_error(
            ValueError,
            f"reduce_window: operand has {nd} dims but window_dimensions={window_dimensions}, "
            f"window_strides={window_strides}; give one entry per operand dimension.",
        )
    init = jnp.asarray(init_value, dtype=x.dtype)
    if any(d != 1 for d in bd):
        # base dilation puts d - 1 init values between neighbouring elements (before padding)
        x = lax.pad(x, init, [(0, 0, d - 1) for d in bd])
    pads = _padding_pairs(padding, x.shape, window_dimensions, window_strides, wd)
    if any(p != (0, 0) for p in pads):
        x = lax.pad(x, init, [(lo, hi, 0) for lo, hi in pads])
    out_shape = [
        (n - ((w - 1) * d + 1)) // s + 1
        for n, w, s, d in zip(x.shape, window_dimensions, window_strides, wd)
    ]
    acc = None
    for offs in itertools.product(*[range(w) for w in window_dimensions]):
        start = [o * d for o, d in zip(offs, wd)]
        limit = [st + (m - 1) * s + 1 for st, m, s in zip(start, out_shape, window_strides)]
        piece = lax.slice(x, start, limit, window_strides)
        acc = piece if acc is None else computation(acc, piece)
    if acc is None:
        return jnp.full(out_shape, init)
    # lax-level computations need equal shapes: broadcast the init value (it may be traced)
    return computation(acc, jnp.broadcast_to(init, acc.shape))


def conv_general_dilated(
    lhs,
    rhs,
    window_strides,
    padding,
    lhs_dilation=None,
    rhs_dilation=None,
    dimension_numbers=None,
    feature_group_count=1,
    batch_group_count=1,
    precision=None,
    preferred_element_type=None,
):
    """N-d convolution (JAX's `lax.conv_general_dilated`; default layout NC..., OI...).

    `dimension_numbers` may be None or a triple of layout strings such as
    ("NHWC", "HWIO", "NHWC"). Written as a sum over window offsets of strided
    slices contracted with one kernel tap each, so every transform applies.
    """

    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    nsp = lhs.ndim - 2
    if dimension_numbers is not None:
        ls, rs, os_ = dimension_numbers
        lhs = jnp.transpose(
            lhs, [ls.index(c) for c in "NC"] + [i for i, c in enumerate(ls) if c not in "NC"]
        )
        rhs = jnp.transpose(
            rhs, [rs.index(c) for c in "OI"] + [i for i, c in enumerate(rs) if c not in "OI"]
        )
    if lhs_dilation is not None and any(d != 1 for d in lhs_dilation):
        lhs = lax.pad(
            lhs, jnp.zeros((), lhs.dtype), [(0, 0, 0)] * 2 + [(0, 0, d - 1) for d in lhs_dilation]
        )
    strides = tuple(window_strides) or (1,) * nsp
    rd = tuple(rhs_dilation or (1,) * nsp)
    window = rhs.shape[2:]
    pads = _padding_pairs(padding, lhs.shape[2:], window, strides, rd)
    if any(p != (0, 0) for p in pads):
        lhs = lax.pad(
            lhs, jnp.zeros((), lhs.dtype), [(0, 0, 0)] * 2 + [(lo, hi, 0) for lo, hi in pads]
        )
    n, c = lhs.shape[:2]
    o = rhs.shape[0]
    g = int(feature_group_count)
    out_sp = [
        (s - ((w - 1) * d + 1)) // st + 1 for s, w, d, st in zip(lhs.shape[2:], window, rd, strides)
    ]
    acc = None
    for offs in itertools.product(*[range(w) for w in window]):
        start = [0, 0] + [k * d for k, d in zip(offs, rd)]
        limit = [n, c] + [st + (m - 1) * s + 1 for st, m, s in zip(start[2:], out_sp, strides)]
        piece = lax.slice(lhs, start, limit, (1, 1) + strides)  # (N, C, out...)
        tap = rhs[(slice(None), slice(None)) + tuple(offs)]  # (O, C/g)
        piece = piece.reshape((n, g, c // g) + tuple(out_sp))
        tap = tap.reshape((g, o // g, c // g))
        term = jnp.einsum("ngc...,goc->ngo...", piece, tap).reshape((n, o) + tuple(out_sp))
        acc = term if acc is None else acc + term
    if dimension_numbers is not None:
        spatial = [ch for ch in ls if ch not in "NC"]  # acc is (N, C, *spatial of lhs)
        perm = [{"N": 0, "C": 1}[ch] if ch in "NC" else 2 + spatial.index(ch) for ch in os_]
        acc = jnp.transpose(acc, perm)
    if preferred_element_type is not None:
        acc = acc.astype(preferred_element_type)
    return acc


def conv(lhs, rhs, window_strides, padding, precision=None, preferred_element_type=None):
    """N-d convolution in the NC.., OI.. layout (JAX's `lax.conv`)."""
    return conv_general_dilated(
        lhs, rhs, window_strides, padding, precision=precision,
        preferred_element_type=preferred_element_type,
    )  # fmt: skip


def conv_with_general_padding(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                              precision=None, preferred_element_type=None):  # fmt: skip
    """`conv` with explicit padding and dilations (JAX's `lax.conv_with_general_padding`)."""
    return conv_general_dilated(
        lhs, rhs, window_strides, padding, lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation, precision=precision,
        preferred_element_type=preferred_element_type,
    )  # fmt: skip
