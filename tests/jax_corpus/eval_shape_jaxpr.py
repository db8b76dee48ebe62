# eval_shape, ShapeDtypeStruct and make_jaxpr introspection
import jax
import jax.numpy as jnp


def f(x, y):
    return jnp.tanh(x @ y).sum(axis=0)


spec = jax.ShapeDtypeStruct((4, 3), jnp.float32)
out = jax.eval_shape(f, spec, jax.ShapeDtypeStruct((3, 5), jnp.float32))
closed = jax.make_jaxpr(f)(jnp.ones((4, 3)), jnp.ones((3, 5)))
prims = [e.primitive.name for e in closed.jaxpr.eqns]
tree_out = jax.eval_shape(lambda d: {"s": d["a"].sum(), "t": d["a"].T}, {"a": spec})
result = (
    out.shape,
    str(out.dtype),
    len(closed.jaxpr.invars),
    len(closed.jaxpr.outvars),
    "dot_general" in prims,
    "tanh" in prims,
    [str(v.aval.shape) for v in closed.jaxpr.invars],
    tree_out["t"].shape,
    tree_out["s"].shape,
    closed.out_avals[0].shape,
)
