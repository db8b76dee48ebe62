# fori_loop, while_loop and scan: the control-flow tutorial's loops
import jax
import jax.numpy as jnp
from jax import lax


def sum_of_squares(n):
    return lax.fori_loop(0, n, lambda i, acc: acc + i * i, 0)


def collatz_steps(n):
    def cond(state):
        n, _ = state
        return n != 1

    def body(state):
        n, steps = state
        return jnp.where(n % 2 == 0, n // 2, 3 * n + 1), steps + 1

    return lax.while_loop(cond, body, (n, 0))[1]


def cumsum_scan(xs):
    def step(carry, x):
        carry = carry + x
        return carry, carry

    return lax.scan(step, 0.0, xs)


final, ys = jax.jit(cumsum_scan)(jnp.arange(5.0))
result = (
    sum_of_squares(10),
    jax.jit(sum_of_squares, static_argnums=0)(10),
    jax.jit(collatz_steps)(27),
    final,
    ys,
    jax.grad(lambda x: lax.fori_loop(0, 3, lambda i, c: c * x, 1.0))(2.0),
    jax.grad(lambda xs: cumsum_scan(xs)[1].sum())(jnp.ones(4)),
)
