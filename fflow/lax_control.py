"""Structured control flow with JAX's signatures: cond, switch, while_loop,
fori_loop, scan, map, associative_scan (re-exported by `fflow.lax`).

Each traces the user's functions once into closed nested programs and binds one
primitive (`cond`, `while`, `scan`), so the loop/branch works the same eagerly,
under `jit`, `grad`, `vmap` and their compositions.

Example:
    >>> import fflow.numpy as jnp
    >>> from fflow import lax
    >>> carry, ys = lax.scan(lambda c, x: (c + x, c * x), 0.0, jnp.arange(4.0))
    >>> float(carry), ys.tolist()
    (6.0, [0.0, 0.0, 2.0, 9.0])
"""

import numpy as np

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.api_util import as_value
from fflow.array import Array
from fflow.core import aval_of_value
from fflow.errors import ShapeError, user_error
from fflow.primitives.control_flow import _join_branch_consts, cond_p, while_bind
from fflow.primitives.named_axis import all_gather_named_p, axis_index_p, pmax_p, pmin_p, psum_p
from fflow.primitives.scan import scan_bind
from fflow.transforms import program_transforms
from fflow.transforms.vmap import find_axis, moveaxis, vmap
from fflow.tree_util import tree_flatten, tree_map, tree_unflatten


def _lax():
    return lax


def _pt():

    return program_transforms


def _same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype


def _leaves(tree):
    leaves, treedef = tree_flatten(tree)
    return [as_value(x) for x in leaves], treedef


class _Out:
    """Receives the output tree of a function being traced."""

    tree = None


def _trace_tree_fun(fun, in_tree, in_avals, out=None, splat=True):
    """Trace `fun(*tree_args)` (`fun(tree)` without `splat`) on abstract leaves:
    (closed program, consts, out tree)."""
    store = out or _Out()

    def flat(*leaves):
        args = tree_unflatten(in_tree, leaves)
        res = fun(*args) if splat else fun(args)
        res_leaves, store.tree = tree_flatten(res)
        return [as_value(x) for x in res_leaves]

    prog, consts = _pt().trace_closed(flat, in_avals)
    return prog, consts, store.tree


def _strengthen(leaves, avals, mask):
    """Drop the weak type of the leaves marked in `mask`."""
    lax = _lax()
    return [
        lax.convert_element_type(x, a.dtype, weak_type=False) if m else x
        for x, a, m in zip(leaves, avals, mask)
    ]


def _promote_weak_inputs(leaves, in_avals, out_avals, keep_weak_of_same_dtype=False):
    """JAX's weak-type promotion of a loop carry: a weakly typed initial value (a
    Python scalar) takes the type the body gives it, e.g. `fori_loop(0, n, f, 0)`
    with a float body. Returns (new leaves, changed). With `keep_weak_of_same_dtype`
    (scan) a weak carry whose body returns the same dtype strongly stays weak inside
    the body, as JAX's scan does (its stacked outputs of the carry stay weak)."""

    lax = _lax()
    out, changed = [], False
    for x, a, b in zip(leaves, in_avals, out_avals):
        if keep_weak_of_same_dtype and a.dtype == b.dtype:
            out.append(x)
            continue
        if a.weak_type and a.shape == b.shape and (a.dtype != b.dtype or not b.weak_type):
            dtype, _ = dtypes.promote_pairs((a.dtype, True), (b.dtype, b.weak_type))
            x = lax.convert_element_type(x, dtype, weak_type=False)
            changed = True
        out.append(x)
    return out, changed


def _check_carry(what, in_tree, out_tree, in_avals, out_avals, fix_name="carry"):
    if in_tree != out_tree:
        raise user_error(
            TypeError,
            f"{what} function carry input and carry output must have the same pytree "
            f"structure, but they differ: the input {fix_name} is {in_tree} and the output "
            f"is {out_tree}.",
        )
    for k, (a, b) in enumerate(zip(in_avals, out_avals)):
        if not _same(a, b):
            raise user_error(
                TypeError,
                f"{what} function carry input and carry output must have equal types: the "
                f"input {fix_name} component {k} has type {a.str_short()} but the "
                f"corresponding output component has type {b.str_short()}. Fix: make the "
                f"new {fix_name} keep its shape and dtype (e.g. .astype("
                f"{a.dtype.name}), or start from an initial value of type {b.str_short()}).",
            )


# ----------------------------------------------------------------------------
# scan


def scan(f, init, xs=None, length=None, reverse=False, unroll=1, _split_transpose=False):
    """Loop `f(carry, x) -> (carry, y)` over the leading axis of `xs`.

    Equivalent to::

        def scan(f, init, xs, length=None):
            carry, ys = init, []
            for x in xs:
                carry, y = f(carry, x)
                ys.append(y)
            return carry, np.stack(ys)

    `init`, `xs` and the outputs may be pytrees; `xs=None` with `length=n` loops
    n times; `reverse=True` runs from the end (ys keep their positions).

    Example:
        >>> import fflow.numpy as jnp
        >>> from fflow import lax
        >>> lax.scan(lambda c, x: (c * x, c), 1.0, jnp.arange(1.0, 5.0))[0].item()
        24.0
    """

    init_leaves, init_tree = _leaves(init)
    xs_leaves, xs_tree = _leaves(xs)
    lengths = []
    for x in xs_leaves:
        aval = aval_of_value(x)
        if aval.ndim == 0:
            raise user_error(
                ShapeError,
                f"scan got an xs leaf of type {aval.str_short()} with no leading axis to loop "
                f"over. Fix: pass arrays with a leading axis, or close over it instead.",
            )
        lengths.append(aval.shape[0])
    if length is not None:
        length = int(length)
    if lengths:
        if len(set(lengths)) > 1 or (length is not None and length != lengths[0]):
            raise user_error(
                ShapeError,
                f"scan got xs with different leading axis sizes {sorted(set(lengths))}"
                + (f" and length={length}" if length is not None else "")
                + ". Fix: give every xs leaf the same leading size.",
            )
        length = lengths[0]
    elif length is None:
        raise user_error(
            ValueError, "scan with no xs needs length=. Fix: pass length=number_of_steps."
        )
    x_avals = [aval_of_value(x).update(shape=aval_of_value(x).shape[1:]) for x in xs_leaves]
    nc = len(init_leaves)
    out = _Out()
    for _ in range(3):
        c_avals = [aval_of_value(c) for c in init_leaves]
        prog, consts, y_tree = _trace_body(f, init_tree, xs_tree, c_avals, x_avals, out)
        out_c_avals = prog.out_avals[:nc]
        init_leaves, changed = _promote_weak_inputs(init_leaves, c_avals, out_c_avals, True)
        if not changed:
            break
    _check_carry("scan body", init_tree, out.carry_tree, c_avals, out_c_avals)
    outs = scan_bind(consts, init_leaves, xs_leaves, prog, length, bool(reverse), int(unroll))
    carry = tree_unflatten(init_tree, outs[:nc])
    ys = tree_unflatten(y_tree, outs[nc:])
    return carry, ys


def _trace_body(f, init_tree, xs_tree, c_avals, x_avals, out):
    nc = len(c_avals)

    def flat(*leaves):
        carry = tree_unflatten(init_tree, leaves[:nc])
        x = tree_unflatten(xs_tree, leaves[nc:])
        res = f(carry, x)
        if not (isinstance(res, (tuple, list)) and len(res) == 2):
            raise user_error(
                TypeError,
                "scan body function must return a pair (new_carry, y), got "
                f"{type(res).__name__}. Fix: return (carry, None) if there is no per-step output.",
            )
        new_carry, y = res
        c_leaves, out.carry_tree = tree_flatten(new_carry)
        if out.carry_tree != init_tree:
            _check_carry("scan body", init_tree, out.carry_tree, c_avals, c_avals)
        y_leaves, out.y_tree = tree_flatten(y)
        return [as_value(v) for v in c_leaves] + [as_value(v) for v in y_leaves]

    prog, consts = _pt().trace_closed(flat, list(c_avals) + list(x_avals))
    return prog, consts, out.y_tree


# ----------------------------------------------------------------------------
# cond / switch


def cond(pred, true_fun, false_fun, *operands, operand=None):
    """`true_fun(*operands)` if `pred` else `false_fun(*operands)`, as one primitive.

    Both branches are traced; under `vmap` with a batched `pred` both run and the
    results are selected per example.

    Example:
        >>> from fflow import lax
        >>> lax.cond(True, lambda x: x + 1, lambda x: x - 1, 1.0).item()
        2.0
    """
    lax = _lax()
    if operand is not None:
        operands = operands + (operand,)
    pred = as_value(pred)
    aval = aval_of_value(pred)
    if aval.shape != ():
        raise user_error(
            TypeError,
            f"cond pred must be a scalar, got {aval.str_short()}. Fix: reduce it "
            f"(jnp.any / jnp.all), or use jnp.where for an elementwise choice.",
        )
    if aval.dtype != np.bool_:
        if aval.dtype.kind not in "iufb":
            raise user_error(TypeError, f"cond pred must be boolean or a number, got {aval.dtype}")
        pred = lax.ne(pred, lax.full((), 0, aval.dtype))
    index = lax.convert_element_type(pred, np.int32)
    return _switch(index, (false_fun, true_fun), operands, "cond")


def switch(index, branches, *operands, operand=None):
    """`branches[index](*operands)`, with `index` clamped to [0, len(branches) - 1].

    Example:
        >>> from fflow import lax
        >>> lax.switch(5, [lambda x: x, lambda x: 2 * x], 3.0).item()
        6.0
    """
    lax = _lax()
    if operand is not None:
        operands = operands + (operand,)
    branches = tuple(branches)
    if not branches:
        raise user_error(ValueError, "switch needs at least one branch")
    index = as_value(index)
    aval = aval_of_value(index)
    if aval.shape != () or aval.dtype.kind not in "iu":
        raise user_error(
            TypeError,
            f"switch index must be an integer scalar, got {aval.str_short()}. Fix: convert "
            f"it (e.g. index.astype(jnp.int32)).",
        )
    if len(branches) == 1:
        return branches[0](*operands)
    index = lax.convert_element_type(index, np.int32)
    index = lax.clamp(np.int32(0), index, np.int32(len(branches) - 1))
    return _switch(index, branches, operands, "switch")


def _switch(index, branches, operands, what):

    op_leaves, op_tree = _leaves(operands)
    op_avals = [aval_of_value(x) for x in op_leaves]
    traced = []
    for br in branches:
        out = _Out()
        prog, consts, tree = _trace_tree_fun(br, op_tree, op_avals, out)
        traced.append([prog, consts, tree, br])
    first = traced[0]
    names = ("false_fun", "true_fun") if what == "cond" else None
    for i, (prog, _, tree, _) in enumerate(traced):
        name = names[i] if names else f"branch {i}"
        name0 = names[0] if names else "branch 0"
        if tree != first[2]:
            raise user_error(
                TypeError,
                f"{what} branches must return the same pytree structure: {name0} returns "
                f"{first[2]} but {name} returns {tree}.",
            )
        for a, b in zip(first[0].out_avals, prog.out_avals):
            if not _same(a, b):
                raise user_error(
                    TypeError,
                    f"{what} branches must return the same types: {name0} returns "
                    f"{a.str_short()} where {name} returns {b.str_short()}. Fix: cast or "
                    f"broadcast one of them.",
                )
    # join weak types: an output is weak only if every branch's is
    n_out = len(first[0].outvars)
    strong = [not all(t[0].out_avals[k].weak_type for t in traced) for k in range(n_out)]
    for t in traced:
        if any(s and a.weak_type for s, a in zip(strong, t[0].out_avals)):
            br = t[3]

            def strengthened(*args, br=br):
                outs, tree = tree_flatten(br(*args))
                outs = [as_value(o) for o in outs]
                avals = [aval_of_value(o) for o in outs]
                outs = _strengthen(outs, avals, [s and a.weak_type for s, a in zip(strong, avals)])
                return tree_unflatten(tree, outs)

            t[0], t[1], _ = _trace_tree_fun(strengthened, op_tree, op_avals)
    progs, consts = _join_branch_consts([t[0] for t in traced], [t[1] for t in traced])
    outs = cond_p.bind(index, *consts, *op_leaves, branches=tuple(progs))
    return tree_unflatten(first[2], outs)


# ----------------------------------------------------------------------------
# while_loop / fori_loop


def while_loop(cond_fun, body_fun, init_val, max_steps=None):
    """Repeat `val = body_fun(val)` while `cond_fun(val)`; returns the final `val`.

    Forward-mode differentiable and batchable (under `vmap` with a batched
    predicate, the loop runs until every example is done and finished examples
    stop changing). For reverse mode pass `max_steps=N`: the loop becomes a scan
    of N steps that stops updating once `cond_fun` is False (it runs at most N
    iterations).

    Example:
        >>> from fflow import lax
        >>> lax.while_loop(lambda x: x < 10, lambda x: x * 2, 1).item()
        16
    """

    if max_steps is not None:
        return _bounded_while(cond_fun, body_fun, init_val, int(max_steps))
    init_leaves, init_tree = _leaves(init_val)
    out = _Out()
    for _ in range(3):
        c_avals = [aval_of_value(c) for c in init_leaves]
        cond_prog, cconsts, _ = _trace_tree_fun(cond_fun, init_tree, c_avals, splat=False)
        _check_pred(cond_prog)
        body_prog, bconsts, out_tree = _trace_tree_fun(
            body_fun, init_tree, c_avals, out, splat=False
        )
        if out_tree != init_tree:
            break
        init_leaves, changed = _promote_weak_inputs(init_leaves, c_avals, body_prog.out_avals)
        if not changed:
            break
    _check_carry("while_loop body", init_tree, out_tree, c_avals, body_prog.out_avals, "val")
    outs = while_bind(cconsts, bconsts, init_leaves, cond_prog, body_prog)
    return tree_unflatten(init_tree, outs)


def _check_pred(cond_prog):
    avals = cond_prog.out_avals
    if len(avals) != 1 or avals[0].shape != () or avals[0].dtype != np.bool_:
        raise user_error(
            TypeError,
            "while_loop cond_fun must return a boolean scalar, got "
            + ", ".join(a.str_short() for a in avals)
            + ". Fix: return a comparison (x < n) or reduce with jnp.all / jnp.any.",
        )


def _bounded_while(cond_fun, body_fun, init_val, max_steps):
    lax = _lax()
    init_leaves, init_tree = _leaves(init_val)
    for _ in range(3):
        c_avals = [aval_of_value(c) for c in init_leaves]
        body_prog, _, out_tree = _trace_tree_fun(body_fun, init_tree, c_avals, splat=False)
        if out_tree != init_tree:
            break
        init_leaves, changed = _promote_weak_inputs(init_leaves, c_avals, body_prog.out_avals)
        if not changed:
            break
    _check_carry("while_loop body", init_tree, out_tree, c_avals, body_prog.out_avals, "val")
    init_val = tree_unflatten(init_tree, init_leaves)

    def step(state, _):
        val, done = state
        pred = as_value(cond_fun(val))
        if aval_of_value(pred).shape != () or aval_of_value(pred).dtype != np.bool_:
            raise user_error(
                TypeError,
                f"while_loop cond_fun must return a boolean scalar, got "
                f"{aval_of_value(pred).str_short()}",
            )
        active = lax.bitwise_and(lax.bitwise_not(done), pred)
        new = body_fun(val)
        val = tree_map(lambda n, o: lax.select(active, as_value(n), as_value(o)), new, val)
        return (val, lax.bitwise_or(done, lax.bitwise_not(pred))), None

    (val, _), _ = scan(step, (init_val, np.bool_(False)), None, length=max_steps)
    return val


def _static_int(x):
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, np.integer)):
        return int(x)
    if type(x) is Array and x.shape == () and x.dtype.kind in "iu":
        return int(x)
    if isinstance(x, np.ndarray) and x.shape == () and x.dtype.kind in "iu":
        return int(x)
    return None


def _index_dtype(lower, upper):
    for b in (lower, upper):
        if not isinstance(b, (int, np.integer)) and hasattr(b, "dtype"):
            return np.dtype(b.dtype)
        if isinstance(b, np.integer):
            return np.dtype(type(b))
    return np.dtype(np.int32)


def fori_loop(lower, upper, body_fun, init_val, unroll=None):
    """`for i in range(lower, upper): val = body_fun(i, val)`; returns `val`.

    With static bounds (Python ints or concrete arrays) this is a scan, so it is
    reverse-differentiable; traced bounds give a while loop.

    Example:
        >>> from fflow import lax
        >>> lax.fori_loop(0, 5, lambda i, s: s + i, 0).item()
        10
    """
    lax = _lax()
    lo, hi = _static_int(lower), _static_int(upper)
    dtype = _index_dtype(lower, upper)
    if lo is not None and hi is not None:
        start, one = np.asarray(lo, dtype), np.asarray(1, dtype)
        if type(lower) is int and type(upper) is int:
            # JAX: the index of Python-int bounds is weakly typed (acc + i stays weak)
            start, one = lax._weak_scalar(lo, dtype), lax._weak_scalar(1, dtype)

        def step(c, _):
            i, val = c
            return (lax.add(i, one), body_fun(i, val)), None

        (_, val), _ = scan(
            step, (start, init_val), None, length=max(hi - lo, 0), unroll=unroll or 1
        )
        return val
    lower = lax.convert_element_type(as_value(lower), dtype)
    upper = lax.convert_element_type(as_value(upper), dtype)

    def cond_fun(c):
        return lax.lt(c[0], c[1])

    def body(c):
        i, u, val = c
        return lax.add(i, np.asarray(1, dtype)), u, body_fun(i, val)

    return while_loop(cond_fun, body, (lower, upper, init_val))[2]


# ----------------------------------------------------------------------------
# map / associative_scan


def map(f, xs, batch_size=None):  # noqa: A001
    """`jnp.stack([f(x) for x in xs])` as a scan (`batch_size` vmaps chunks of xs).

    Example:
        >>> import fflow.numpy as jnp
        >>> from fflow import lax
        >>> lax.map(lambda x: x * 2, jnp.arange(3.0)).tolist()
        [0.0, 2.0, 4.0]
    """
    lax = _lax()
    if batch_size is None:
        return scan(lambda _, x: ((), f(x)), (), xs)[1]

    leaves, tree = _leaves(xs)
    n = aval_of_value(leaves[0]).shape[0]
    bs = int(batch_size)
    nb, rem = divmod(n, bs)
    ys = None
    if nb:
        main = [
            lax.reshape(lax.slice_in_dim(x, 0, nb * bs), (nb, bs) + aval_of_value(x).shape[1:])
            for x in leaves
        ]
        ys = scan(lambda _, x: ((), vmap(f)(x)), (), tree_unflatten(tree, main))[1]
        ys = tree_map(lambda y: lax.reshape(y, (nb * bs,) + aval_of_value(y).shape[2:]), ys)
    if rem:
        rest = [lax.slice_in_dim(x, nb * bs, n) for x in leaves]
        ys_rest = vmap(f)(tree_unflatten(tree, rest))
        if ys is None:
            return ys_rest
        ys = tree_map(lambda a, b: lax.concatenate([a, b], 0), ys, ys_rest)
    return ys


def associative_scan(fn, elems, reverse=False, axis=0):
    """Inclusive scan of an associative `fn` over `axis` of a pytree (O(log n) depth).

    Example:
        >>> import fflow.numpy as jnp
        >>> from fflow import lax
        >>> lax.associative_scan(lambda a, b: a + b, jnp.arange(5.0)).tolist()
        [0.0, 1.0, 3.0, 6.0, 10.0]
    """
    lax = _lax()

    leaves, tree = _leaves(elems)
    if not leaves:
        return elems
    ndim = aval_of_value(leaves[0]).ndim
    axis = axis % ndim
    leaves = [moveaxis(x, axis, 0) for x in leaves]
    n = aval_of_value(leaves[0]).shape[0]
    for x in leaves:
        if aval_of_value(x).shape[0] != n:
            raise user_error(ShapeError, "associative_scan: elems need one size along axis")
    if reverse:
        leaves = [lax.rev(x, (0,)) for x in leaves]

    def combine(a, b):
        out = fn(tree_unflatten(tree, a), tree_unflatten(tree, b))
        return [as_value(o) for o in tree_flatten(out)[0]]

    def sl(x, start, stop, step=1):
        return lax.slice_in_dim(x, start, stop, step, 0)

    def interleave(a, b):
        # a has ceil(n/2) rows, b floor(n/2): a0 b0 a1 b1 ...
        na, nb = aval_of_value(a).shape[0], aval_of_value(b).shape[0]
        rest = aval_of_value(a).shape[1:]
        head = sl(a, 0, nb)
        pair = lax.concatenate(
            [lax.reshape(head, (nb, 1) + rest), lax.reshape(b, (nb, 1) + rest)], 1
        )
        out = lax.reshape(pair, (2 * nb,) + rest)
        if na > nb:
            out = lax.concatenate([out, sl(a, nb, na)], 0)
        return out

    def rec(xs):
        m = aval_of_value(xs[0]).shape[0]
        if m < 2:
            return xs
        reduced = combine([sl(x, 0, m - 1, 2) for x in xs], [sl(x, 1, m, 2) for x in xs])
        odd = rec(reduced)
        if m % 2 == 0:
            even = combine(
                [sl(o, 0, aval_of_value(o).shape[0] - 1) for o in odd], [sl(x, 2, m, 2) for x in xs]
            )
        else:
            even = combine(odd, [sl(x, 2, m, 2) for x in xs])
        even = [lax.concatenate([sl(x, 0, 1), e], 0) for x, e in zip(xs, even)]
        return [interleave(e, o) for e, o in zip(even, odd)]

    out = rec(leaves)
    if reverse:
        out = [lax.rev(x, (0,)) for x in out]
    out = [moveaxis(x, 0, axis) for x in out]
    return tree_unflatten(tree, out)


# ----------------------------------------------------------------------------
# collectives over a named vmap axis


def _axis_names(axis_name, what):

    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    size = 1
    for n in names:
        trace = find_axis(n)
        if trace is None:
            raise user_error(
                NameError,
                f"unbound axis name: {n!r}. {what} needs an enclosing "
                f"fflow.vmap(..., axis_name={n!r}).",
            )
        size *= trace.axis_size
    return names, size


def psum(x, axis_name):
    """Sum `x` over the examples of the vmap named `axis_name` (every example gets it).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> from fflow import lax
        >>> fflow.vmap(lambda v: v / lax.psum(v, "i"), axis_name="i")(jnp.ones(4)).tolist()
        [0.25, 0.25, 0.25, 0.25]
    """

    names, _ = _axis_names(axis_name, "psum")
    return tree_map(lambda v: psum_p.bind(as_value(v), axis_name=names), x)


def pmean(x, axis_name):
    """Mean of `x` over the examples of the named vmap axis.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> from fflow import lax
        >>> fflow.vmap(lambda v: v - lax.pmean(v, "i"), axis_name="i")(jnp.arange(3.0)).tolist()
        [-1.0, 0.0, 1.0]
    """
    lax = _lax()
    names, size = _axis_names(axis_name, "pmean")
    return tree_map(lambda v: lax.div(v, size), psum(x, names))


def pmax(x, axis_name):
    """Maximum of `x` over the examples of the named vmap axis.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> from fflow import lax
        >>> fflow.vmap(lambda v: lax.pmax(v, "i"), axis_name="i")(jnp.arange(3.0)).tolist()
        [2.0, 2.0, 2.0]
    """

    names, _ = _axis_names(axis_name, "pmax")
    return tree_map(lambda v: pmax_p.bind(as_value(v), axis_name=names), x)


def pmin(x, axis_name):
    """Minimum of `x` over the examples of the named vmap axis.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> from fflow import lax
        >>> fflow.vmap(lambda v: lax.pmin(v, "i"), axis_name="i")(jnp.arange(3.0)).tolist()
        [0.0, 0.0, 0.0]
    """

    names, _ = _axis_names(axis_name, "pmin")
    return tree_map(lambda v: pmin_p.bind(as_value(v), axis_name=names), x)


def all_gather(x, axis_name, *, axis=0, tiled=False):
    """Every example's `x`, stacked along a new `axis` (concatenated if `tiled`).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> from fflow import lax
        >>> fflow.vmap(lambda v: lax.all_gather(v, "i"), axis_name="i")(jnp.arange(2.0)).tolist()
        [[0.0, 1.0], [0.0, 1.0]]
    """

    names, size = _axis_names(axis_name, "all_gather")

    def gather(v):
        v = as_value(v)
        ndim = aval_of_value(v).ndim
        ax = axis % (ndim if tiled else ndim + 1)
        return all_gather_named_p.bind(
            v, axis_name=names, axis=ax, tiled=bool(tiled), axis_size=size
        )

    return tree_map(gather, x)


def axis_index(axis_name):
    """The index of the current example along the named vmap axis (int32).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> from fflow import lax
        >>> fflow.vmap(lambda v: v * lax.axis_index("i"), axis_name="i")(jnp.ones(3)).tolist()
        [0.0, 1.0, 2.0]
    """

    names, _ = _axis_names(axis_name, "axis_index")
    return axis_index_p.bind(axis_name=names)


__all__ = [
    "psum",
    "pmean",
    "pmax",
    "pmin",
    "all_gather",
    "axis_index",
    "cond",
    "switch",
    "while_loop",
    "fori_loop",
    "scan",
    "map",
    "associative_scan",
]
