"""`jax.interpreters.ad` / `.batching`: where a user-defined primitive's JVP,
transpose and batching rules go (fflow's own rule tables, with JAX's names).

Example:
    >>> import fflow, fflow.numpy as jnp
    >>> from fflow.extend import core
    >>> from fflow.interpreters import ad
    >>> cube_p = core.Primitive("cube")
    >>> _ = cube_p.def_impl(lambda x: x**3)
    >>> _ = cube_p.def_abstract_eval(lambda x: core.ShapedArray(x.shape, x.dtype))
    >>> ad.defjvp(cube_p, lambda t, x: 3 * x**2 * t)
    >>> float(fflow.grad(lambda x: cube_p.bind(x))(2.0))
    12.0
"""

import types

from fflow.transforms import autodiff as _ad
from fflow.transforms import vmap as _vmap

ad = types.ModuleType("fflow.interpreters.ad", "JVP and transpose rules (JAX's interpreters.ad)")
ad.primitive_jvps = _ad.jvp_rules
ad.primitive_transposes = _ad.transpose_rules
ad.Zero = _ad.Zero
ad.UndefinedPrimal = _ad.UndefinedPrimal
ad.is_undefined_primal = _ad.is_undefined
ad.instantiate_zeros = _ad.instantiate
ad.zeros_like_aval = _ad.zeros_like_aval
ad.add_tangents = _ad.add_tangents


def _defjvp(prim, *jvp_fns):
    """JAX's `ad.defjvp`: one `jvp_fn(tangent, *primals, **params)` per input."""
    _ad.defjvp(prim, *jvp_fns)


def _deflinear(prim, transpose_rule):
    """JAX's `ad.deflinear`: `transpose_rule(ct, **params)` returns one cotangent per input."""
    _ad.deflinear(prim, lambda ct, *args, **params: list(transpose_rule(ct, **params)))


def _deflinear2(prim, transpose_rule):
    """JAX's `ad.deflinear2`: `transpose_rule(ct, *args, **params)`."""
    _ad.deflinear(prim, lambda ct, *args, **params: list(transpose_rule(ct, *args, **params)))


ad.defjvp = _defjvp
ad.deflinear = _deflinear
ad.deflinear2 = _deflinear2

batching = types.ModuleType("fflow.interpreters.batching", "batching rules (JAX's names)")
batching.primitive_batchers = _vmap.batch_rules
batching.not_mapped = _vmap.not_mapped


def _defvectorized(prim):
    """Elementwise: the rule applies the primitive to the batched operands as they are."""

    def rule(args, dims, **params):
        dim = next(d for d in dims if d is not None)
        return prim.bind(*args, **params), dim

    _vmap.batch_rules[prim] = rule


batching.defvectorized = _defvectorized

mlir = types.ModuleType("fflow.interpreters.mlir", "no MLIR here: fflow lowers to NumPy/CUDA")


def _register_lowering(prim, rule, platform=None):
    """Accepted and ignored: fflow runs a user primitive's `impl` under jit."""


mlir.register_lowering = _register_lowering
mlir.lower_fun = lambda fun, multiple_results=True: fun

__all__ = ["ad", "batching", "mlir"]
