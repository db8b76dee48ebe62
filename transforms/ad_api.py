"""Public autodiff API on pytrees: jvp, linearize, vjp, grad, value_and_grad,
jacfwd, jacrev, hessian."""

import functools

import numpy as np
from fflow.transforms import autodiff as ad
from fflow.transforms.staging import eval_program, trace_to_program
from fflow.transforms.vmap import vmap

from fflow import dtypes
from fflow import lax_ops as lax
from fflow.api_util import Store, as_value, flatten_fun, normalize_argnums
from fflow.array import Array
from fflow.core import ShapedArray, aval_of_value
from fflow.errors import api_boundary, check_keywords, user_error
from fflow.numpy._util import mark_weak
from fflow.tree_util import tree_flatten, tree_map, tree_structure, tree_unflatten


def _instantiate_like(t, primal):
    if type(t) is ad.Zero:
        return as_value(ad.zeros_like_aval(aval_of_value(primal).strip_weak_type()))
    pa = aval_of_value(primal)
    if pa.weak_type:
        ta = aval_of_value(t)
        if not ta.weak_type and ta.dtype == pa.dtype:
            # JAX: a cotangent has its primal's type (grad of a Python float is weak)

            return (
                Array(t._value, True) if type(t) is Array and t._sharding is None else mark_weak(t)
            )
    return t


@check_keywords
@api_boundary
def jvp(fun, primals, tangents, has_aux=False):
    """Forward-mode: (fun(*primals), J @ tangents).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> y, t = fflow.jvp(jnp.sin, (0.0,), (1.0,))
        >>> float(t)
        1.0
    """
    return _jvp(fun, primals, tangents, has_aux, int_float0=True)


def _jvp(fun, primals, tangents, has_aux, int_float0):
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise user_error(
            TypeError,
            "jvp: primals and tangents must be tuples or lists. Fix: fflow.jvp(f, (x,), (t,)).",
        )
    p_leaves, p_tree = tree_flatten(tuple(primals))
    t_leaves, t_tree = tree_flatten(tuple(tangents))
    if p_tree != t_tree:
        raise user_error(
            TypeError, f"jvp: primals structure {p_tree} differs from tangents structure {t_tree}"
        )
    p_leaves = [as_value(x) for x in p_leaves]
    t_leaves = [as_value(x) for x in t_leaves]
    for k, (p, t) in enumerate(zip(p_leaves, t_leaves)):
        pa, ta = aval_of_value(p), aval_of_value(t)
        if ta.dtype == dtypes.float0 and pa.dtype.kind in "biu" and ta.shape == pa.shape:
            # JAX's tangent of an integer input carries no data: a zero of its type
            t_leaves[k] = t = as_value(ad.zeros_like_aval(pa.strip_weak_type()))
            ta = aval_of_value(t)
        if pa.shape != ta.shape or pa.dtype != ta.dtype:
            raise user_error(
                TypeError,
                f"jvp: primal {pa.str_short()} and tangent {ta.str_short()} must have the same "
                f"shape and dtype",
            )
    out_store = Store()
    aux_store = Store()
    flat = flatten_fun(
        _split_aux(fun, has_aux, aux_store), tree_structure((tuple(primals), {})), out_store
    )
    outs, touts = ad.jvp_flat(
        lambda *xs: flat(
            *xs,
        ),
        p_leaves,
        t_leaves,
    )
    touts = [_instantiate_like(t, p) for t, p in zip(touts, outs)]
    # JAX: the tangent of an integer or boolean output is float0 (no data)
    if int_float0:
        touts = [
            np.zeros(np.shape(t), dtypes.float0) if aval_of_value(p).dtype.kind in "biu" else t
            for t, p in zip(touts, outs)
        ]
    out_tree = out_store.value
    result = (tree_unflatten(out_tree, outs), tree_unflatten(out_tree, touts))
    if has_aux:
        return result + (_strip(aux_store.value),)
    return result


def _split_aux(fun, has_aux, aux_store):
    if not has_aux:
        return fun

    def wrapped(*args, **kwargs):
        out = fun(*args, **kwargs)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise user_error(
                TypeError,
                "has_aux=True requires the function to return a pair (output, aux). Fix: "
                "return (loss, aux), or drop has_aux=True",
            )
        aux_store.set(out[1])
        return out[0]

    return wrapped


def _strip(tree):
    """Values that escaped through `aux`: unwrap JVP tracers of finished traces."""

    def strip(x):
        while isinstance(x, ad.JVPTracer) and x._trace.finished:
            x = x.primal
        return x

    return tree_map(strip, tree)


@check_keywords
@api_boundary
def linearize(fun, *primals):
    """(fun(*primals), f_jvp) where f_jvp(*tangents) applies the linear map."""
    p_leaves, p_tree = tree_flatten((primals, {}))
    p_leaves = [as_value(x) for x in p_leaves]
    out_store = Store()
    flat = flatten_fun(fun, p_tree, out_store)
    outs, program = ad.linearize_flat(flat, p_leaves)
    out_tree = out_store.value

    def f_jvp(*tangents):
        t_leaves, t_tree = tree_flatten((tangents, {}))
        if t_tree != p_tree:
            raise TypeError(f"linearize: tangent structure {t_tree} differs from {p_tree}")
        res = eval_program(program, program.consts, [as_value(t) for t in t_leaves])
        return tree_unflatten(out_tree, res)

    return tree_unflatten(out_tree, outs), f_jvp


@check_keywords
@api_boundary
def vjp(fun, *primals, has_aux=False):
    """(fun(*primals), vjp_fn[, aux]); vjp_fn(ct) returns a tuple with one cotangent per primal.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> y, f_vjp = fflow.vjp(jnp.sin, 0.0)
        >>> float(f_vjp(1.0)[0])
        1.0
    """
    p_leaves, p_tree = tree_flatten((primals, {}))
    p_leaves = [as_value(x) for x in p_leaves]
    out_store = Store()
    aux_store = Store()
    flat = flatten_fun(_split_aux(fun, has_aux, aux_store), p_tree, out_store)
    outs, vjp_flat_fn, _ = ad.vjp_flat(flat, p_leaves)
    out_tree = out_store.value

    def vjp_fn(ct):
        ct_leaves, ct_tree = tree_flatten(ct)
        if ct_tree != out_tree:
            raise user_error(
                TypeError, f"vjp: cotangent structure {ct_tree} differs from output {out_tree}"
            )
        ct_leaves = [as_value(c) for c in ct_leaves]
        for c, o in zip(ct_leaves, outs):
            ca, oa = aval_of_value(c), aval_of_value(o)
            if ca.shape != oa.shape:
                raise user_error(
                    TypeError,
                    f"vjp: cotangent of shape {ca.shape} for an output of shape {oa.shape}",
                )
        cts = vjp_flat_fn(ct_leaves)
        cts = [_instantiate_like(c, p) for c, p in zip(cts, p_leaves)]
        args, _ = tree_unflatten(p_tree, cts)
        return tuple(args)

    out = tree_unflatten(out_tree, outs)
    if has_aux:
        return out, vjp_fn, _strip(aux_store.value)
    return out, vjp_fn


@check_keywords
def value_and_grad(fun, argnums=0, has_aux=False, holomorphic=False, allow_int=False):
    """A function returning (fun(*args), gradient w.r.t. args[argnums]).

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> v, g = fflow.value_and_grad(lambda x: jnp.sum(x ** 2))(jnp.arange(3.0))
        >>> float(v), g.tolist()
        (5.0, [0.0, 2.0, 4.0])
    """

    @functools.wraps(fun)
    @api_boundary
    def value_and_grad_fun(*args, **kwargs):
        single, nums = normalize_argnums(argnums, len(args))
        diff_args = [args[i] for i in nums]
        leaves, in_tree = tree_flatten(diff_args)
        leaves = [as_value(x) for x in leaves]
        if not allow_int:
            for leaf_i, x in enumerate(leaves):
                ad.check_differentiable_input(x, _argnum_of_leaf(diff_args, nums, leaf_i))
        aux_store = Store()

        def f_flat(*diff_leaves):
            new_args = list(args)
            for i, a in zip(nums, tree_unflatten(in_tree, diff_leaves)):
                new_args[i] = a
            out = fun(*new_args, **kwargs)
            if has_aux:
                if not (isinstance(out, (tuple, list)) and len(out) == 2):
                    raise user_error(
                        TypeError,
                        "has_aux=True requires the function to return a pair (output, aux). Fix: "
                        "return (loss, aux), or drop has_aux=True",
                    )
                out, aux = out
                aux_store.set(aux)
            out = as_value(out) if not isinstance(out, (tuple, list, dict)) else out
            if isinstance(out, (tuple, list, dict)):
                raise user_error(
                    TypeError,
                    f"grad requires a scalar output, but the function returned a "
                    f"{type(out).__name__}. Fix: return a scalar (use has_aux=True to return "
                    f"extra values).",
                )
            ad.check_scalar_output(out)
            return [out]

        (out,), vjp_fn, _ = ad.vjp_flat(f_flat, leaves)
        cts = vjp_fn([ad.ones_like_value(out)])
        grads = [_instantiate_like(c, p) for c, p in zip(cts, leaves)]
        g = tree_unflatten(in_tree, grads)
        g = g[0] if single else tuple(g)
        if has_aux:
            return (out, _strip(aux_store.value)), g
        return out, g

    return value_and_grad_fun


def _argnum_of_leaf(diff_args, nums, leaf_index):
    count = 0
    for n, a in zip(nums, diff_args):
        k = len(tree_flatten(a)[0])
        if leaf_index < count + k:
            return n
        count += k
    return nums[-1]


@check_keywords
def grad(fun, argnums=0, has_aux=False, holomorphic=False, allow_int=False):
    """The gradient of a scalar function w.r.t. args[argnums].

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> float(fflow.grad(jnp.sin)(0.0))
        1.0
    """
    vg = value_and_grad(fun, argnums, has_aux, holomorphic, allow_int)

    @functools.wraps(fun)
    @api_boundary
    def grad_fun(*args, **kwargs):
        (value, g) = vg(*args, **kwargs)
        if has_aux:
            return g, value[1]
        return g

    return grad_fun


def _std_basis(leaves):
    """Identity matrices shaped (total_size, *leaf_shape) per leaf, for Jacobians."""
    sizes = [int(np.prod(aval_of_value(x).shape, dtype=np.int64)) for x in leaves]
    total = sum(sizes)
    out = []
    start = 0
    for x, n in zip(leaves, sizes):
        aval = aval_of_value(x)
        eye = np.zeros((total, n), dtype=aval.dtype)
        eye[start : start + n] = np.eye(n, dtype=aval.dtype)
        out.append(eye.reshape((total,) + aval.shape))
        start += n
    return out, sizes


@check_keywords
def jacfwd(fun, argnums=0, has_aux=False, holomorphic=False):
    """Jacobian by forward mode: vmap of jvp over the standard basis."""

    @api_boundary
    def jac_fun(*args, **kwargs):
        single, nums = normalize_argnums(argnums, len(args))
        diff = [args[i] for i in nums]
        leaves, in_tree = tree_flatten(diff)
        leaves = [as_value(x) for x in leaves]
        basis, sizes = _std_basis(leaves)

        def f_of_diff(*d_leaves):
            new_args = list(args)
            for i, a in zip(nums, tree_unflatten(in_tree, d_leaves)):
                new_args[i] = a
            return fun(*new_args, **kwargs)

        def push(*t_leaves):
            return _jvp(f_of_diff, tuple(leaves), tuple(t_leaves), has_aux, int_float0=False)

        # the primal output does not depend on the basis vector: out_axes None keeps it unbatched
        res = vmap(push, in_axes=0, out_axes=(None, -1))(*basis) if not has_aux else None
        if has_aux:
            out, tangents, aux = vmap(push, in_axes=0, out_axes=(None, -1, None))(*basis)
        else:
            out, tangents = res
        jac = tree_map(lambda t: _split_last(t, sizes, leaves, single, in_tree), tangents)
        return (jac, aux) if has_aux else jac

    return jac_fun


def _split_last(t, sizes, leaves, single, in_tree):
    """(out_shape..., total) -> per-input pieces shaped out_shape + in_shape."""
    aval = aval_of_value(t)
    out_shape = aval.shape[:-1]
    pieces = []
    start = 0
    for x, n in zip(leaves, sizes):
        piece = lax.slice_in_dim(t, start, start + n, axis=aval.ndim - 1)
        pieces.append(lax.reshape(piece, out_shape + aval_of_value(x).shape))
        start += n
    tree = tree_unflatten(in_tree, pieces)
    return tree[0] if single else tuple(tree)


@check_keywords
def jacrev(fun, argnums=0, has_aux=False, holomorphic=False, allow_int=False):
    """Jacobian by reverse mode: vmap of vjp over the output's standard basis."""

    @api_boundary
    def jac_fun(*args, **kwargs):
        single, nums = normalize_argnums(argnums, len(args))
        diff = [args[i] for i in nums]

        def f_of_diff(*d):
            new_args = list(args)
            for i, a in zip(nums, d):
                new_args[i] = a
            return fun(*new_args, **kwargs)

        if has_aux:
            out, vjp_fn, aux = vjp(f_of_diff, *diff, has_aux=True)
        else:
            out, vjp_fn = vjp(f_of_diff, *diff)
        out_leaves, out_tree = tree_flatten(out)
        basis, sizes = _std_basis(out_leaves)

        def pull(*ct_leaves):
            return vjp_fn(tree_unflatten(out_tree, list(ct_leaves)))

        cts = vmap(pull)(*basis)  # each leaf: (total_out, *in_shape)

        def per_output(ct):
            pieces = []
            start = 0
            aval = aval_of_value(ct)
            for o, n in zip(out_leaves, sizes):
                piece = lax.slice_in_dim(ct, start, start + n, axis=0)
                pieces.append(lax.reshape(piece, aval_of_value(o).shape + aval.shape[1:]))
                start += n
            return pieces

        per_arg = [tree_map(per_output, c) for c in cts]
        # rearrange: output tree of (input tree)
        jac_leaves = []
        for k in range(len(out_leaves)):
            jac_leaves.append(
                tuple(
                    tree_map(lambda p, k=k: p[k], a, is_leaf=lambda v: isinstance(v, list))
                    for a in per_arg
                )
            )
        jac_leaves = [j[0] if single else j for j in jac_leaves]
        jac = tree_unflatten(out_tree, jac_leaves)
        return (jac, aux) if has_aux else jac

    return jac_fun


@check_keywords
def hessian(fun, argnums=0, has_aux=False, holomorphic=False):
    """jacfwd(jacrev(fun))."""
    return jacfwd(jacrev(fun, argnums, has_aux), argnums, has_aux=has_aux)


class ShapeDtypeStruct:
    """A shape and dtype without data (JAX's `jax.ShapeDtypeStruct`)."""

    __slots__ = ("shape", "dtype", "sharding", "weak_type")

    def __init__(self, shape, dtype, sharding=None, *, weak_type=False):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.sharding = sharding
        self.weak_type = bool(weak_type)

    @classmethod
    def like(cls, x):
        """The shape and dtype (and weak type) of `x`: an array, a tracer, a NumPy array
        or another ShapeDtypeStruct (JAX's `ShapeDtypeStruct.like`)."""
        if isinstance(x, ShapeDtypeStruct):
            return cls(x.shape, x.dtype, x.sharding, weak_type=x.weak_type)
        aval = aval_of_value(x)
        return cls(aval.shape, aval.dtype, weak_type=aval.weak_type)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __eq__(self, other):
        return (
            isinstance(other, ShapeDtypeStruct)
            and self.shape == other.shape
            and self.dtype == other.dtype
        )

    def __hash__(self):
        return hash((self.shape, self.dtype))

    def __repr__(self):
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype.name})"


def eval_shape(fun, *args, **kwargs):
    """The output shapes/dtypes of `fun` without computing anything.

    Example:
        >>> import fflow, fflow.numpy as jnp
        >>> fflow.eval_shape(lambda x: x @ x.T, jnp.ones((3, 2)))
        ShapeDtypeStruct(shape=(3, 3), dtype=float32)
    """

    leaves, in_tree = tree_flatten((args, kwargs))
    in_avals = []
    for x in leaves:
        if isinstance(x, ShapeDtypeStruct) or (
            hasattr(x, "shape") and hasattr(x, "dtype") and not hasattr(x, "__array__")
        ):
            in_avals.append(ShapedArray(x.shape, x.dtype))
        else:
            in_avals.append(aval_of_value(as_value(x)))
    out_store = Store()
    flat = flatten_fun(fun, in_tree, out_store)
    program = trace_to_program(flat, in_avals)
    return tree_unflatten(
        out_store.value, [ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in program.outvars]
    )
