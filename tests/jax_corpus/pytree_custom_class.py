# A custom pytree node (register_pytree_node_class) through jit and grad
import jax
import jax.numpy as jnp
from jax.tree_util import register_pytree_node, register_pytree_node_class


@register_pytree_node_class
class Linear:
    def __init__(self, w, b, name="lin"):
        self.w, self.b, self.name = w, b, name

    def tree_flatten(self):
        return (self.w, self.b), self.name

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, name=aux)

    def __call__(self, x):
        return x @ self.w + self.b


class Box:
    def __init__(self, v):
        self.v = v


register_pytree_node(Box, lambda b: ((b.v,), None), lambda aux, ch: Box(ch[0]))

model = Linear(jnp.ones((3, 2)) * 0.5, jnp.array([0.1, -0.2]))
x = jnp.arange(6.0).reshape(2, 3)
g = jax.grad(lambda m: jnp.sum(m(x) ** 2))(model)
boxed = jax.jit(lambda b: Box(b.v * 2))(Box(jnp.array(3.0)))
result = (g.w, g.b, g.name, boxed.v, jax.tree_util.tree_structure(model).num_leaves)
