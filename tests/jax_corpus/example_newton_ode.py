# Newton's method with grad, and an RK4 ODE integrator differentiated end to end
import jax
import jax.numpy as jnp


def newton(f, x0, steps=6):
    df = jax.grad(f)
    x = x0
    for _ in range(steps):
        x = x - f(x) / df(x)
    return x


def rk4(f, y0, t1, n=20):
    h = t1 / n

    def step(y, _):
        k1 = f(y)
        k2 = f(y + h / 2 * k1)
        k3 = f(y + h / 2 * k2)
        k4 = f(y + h * k3)
        return y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), None

    return jax.lax.scan(step, y0, None, length=n)[0]


decay = lambda k: rk4(lambda y: -k * y, jnp.array(1.0), 1.0)
result = (
    newton(lambda x: x**3 - 2.0, 1.0),
    decay(0.5),
    jax.grad(decay)(0.5),
    jax.jit(jax.grad(decay))(0.5),
    jax.hessian(lambda x: jnp.sum(x**3))(jnp.array([1.0, 2.0])),
)
