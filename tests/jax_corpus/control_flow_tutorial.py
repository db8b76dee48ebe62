# JAX "Control flow and logical operators with JIT": cond, switch, while_loop, fori_loop,
# scan, lax.map with batch_size, where vs cond under grad, logical ops
import jax
import jax.numpy as jnp
from jax import lax


def f(x):
    return lax.cond(x > 0, lambda x: x * 2.0, lambda x: x - 1.0, x)


def body(i, val):
    return val + i * 0.5


def collatz_steps(n):
    def cond(c):
        return c[0] != 1

    def step(c):
        n, k = c
        return jnp.where(n % 2 == 0, n // 2, 3 * n + 1), k + 1

    return lax.while_loop(cond, step, (n, 0))[1]


def cumulative(xs):
    def step(carry, x):
        carry = carry * 0.9 + x
        return carry, carry * 2

    return lax.scan(step, 0.0, xs)


branches = [lambda x: x + 1, lambda x: x * 10, lambda x: -x]
xs = jnp.arange(1.0, 6.0)
safe_log = lambda x: jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), 0.0)
result = (
    jax.jit(f)(3.0),
    jax.jit(f)(-3.0),
    jax.grad(f)(2.0),
    jax.vmap(f)(jnp.array([-1.0, 0.5])),
    [lax.switch(i, branches, 5.0) for i in range(4)],
    jax.jit(lambda i: lax.switch(i, branches, jnp.float32(5.0)))(2),
    lax.fori_loop(0, 10, body, 0.0),
    jax.jit(lambda n: lax.fori_loop(0, n, body, 0.0))(10),
    jax.jit(collatz_steps)(27),
    jax.vmap(collatz_steps)(jnp.array([6, 7, 8])),
    cumulative(xs),
    jax.grad(lambda xs: cumulative(xs)[0])(xs),
    lax.map(lambda x: x**2 + 1, xs),
    lax.map(lambda x: jnp.sin(x), xs, batch_size=2),
    jax.grad(safe_log)(0.0),
    jax.grad(safe_log)(2.0),
    jnp.logical_and(xs > 2, xs < 5),
    jnp.logical_or(xs < 2, xs > 4),
    jnp.logical_not(xs > 3),
    jnp.any(xs > 4),
    jnp.all(xs > 0),
    lax.select(xs > 2, xs, -xs),
)
